#!/usr/bin/env bash
# Set up LightStream on a fresh Debian/Ubuntu machine: redis-server (and docker-compose, used
# to validate compose.yaml) from the distribution when missing, then a virtualenv in .venv with
# the pinned requirements. Safe to run again: it only adds what is missing.
set -euo pipefail
cd "$(dirname "$0")/.."

missing=()
command -v redis-server >/dev/null 2>&1 || missing+=(redis-server)
command -v docker-compose >/dev/null 2>&1 || missing+=(docker-compose)
if [ ${#missing[@]} -gt 0 ]; then
  sudo=""
  [ "$(id -u)" -eq 0 ] || sudo="sudo"
  echo "installing ${missing[*]} with apt-get"
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "${missing[@]}" >/dev/null
fi

python=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$python" -m venv .venv
fi
.venv/bin/python -m pip install -q --upgrade pip
.venv/bin/python -m pip install -q -r requirements-test.txt
# TGI's client for the tests, without its dependencies (requirements-tgi.txt says why)
.venv/bin/python -m pip install -q --no-deps -r requirements-tgi.txt
# FastChat's servers, for the tests that put LightStream behind them, in their own virtualenv:
# FastChat's API server streams only with pydantic 1 (requirements-fastchat.txt)
if [ ! -x .venv-fastchat/bin/python ]; then
  "$python" -m venv .venv-fastchat
fi
.venv-fastchat/bin/python -m pip install -q -r requirements-fastchat.txt
echo "LightStream is set up: .venv/bin/python -m lightstream serve"
