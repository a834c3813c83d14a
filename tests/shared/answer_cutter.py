"""A TCP proxy in front of a real redis-server that can lose one answer: Redis runs the command,
and the client's connection is closed before the answer reaches it, as when a network or a
timeout cuts a read that Redis has already served."""

from __future__ import annotations

import contextlib
import socket
import threading


class AnswerCutter:
    def __init__(self, redis_host: str, redis_port: int) -> None:
        self.target = (redis_host, redis_port)
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = self._listener.getsockname()[1]
        self._cut_marker: bytes | None = None
        self.cuts = 0
        self._lock = threading.Lock()
        threading.Thread(target=self._accept, daemon=True).start()

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def cut_next_answer_with(self, marker: bytes) -> None:
        """The next answer from Redis that holds ``marker`` is dropped and its connection closed."""
        with self._lock:
            self._cut_marker = marker

    def close(self) -> None:
        self._listener.close()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            server = socket.create_connection(self.target)
            threading.Thread(target=self._pump, args=(client, server, False), daemon=True).start()
            threading.Thread(target=self._pump, args=(server, client, True), daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket, answers: bool) -> None:
        with contextlib.suppress(OSError):
            while data := src.recv(65536):
                if answers and self._take_cut(data):
                    break
                dst.sendall(data)
        for s in (src, dst):
            with contextlib.suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)
            s.close()

    def _take_cut(self, data: bytes) -> bool:
        with self._lock:
            if self._cut_marker is None or self._cut_marker not in data:
                return False
            self._cut_marker = None
            self.cuts += 1
            return True
