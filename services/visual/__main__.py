"""python -m services.visual: a visual replica (the model's vision tower and projector)."""

from __future__ import annotations

import logging
import os

import torch

from services.visual.families import load_tower, random_tower
from services.visual.metrics import VisualCollector, VisualMetrics
from services.visual.service import VisualService
from shared.busy_poll import BusyPoll
from shared.cli import parse_config
from shared.heartbeat import HeartbeatPublisher
from shared.image_store import ImageStore
from shared.log import setup_logging
from shared.model_config import ModelConfig
from shared.redis_link import RedisLink, RedisTarget
from shared.service_main import run_beating, serve_collector, stop_on_signals
from shared.streams import SERVICE_VISUAL, StreamNames
from shared.visual_config import VisualConfig

log = logging.getLogger(__name__)

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def _placement(cfg: VisualConfig, model: ModelConfig) -> tuple[torch.device, torch.dtype]:
    """The device and dtype the worker would pick for this model (services/worker/build.py): the
    embeddings join the language model's in its dtype."""
    cuda = cfg.device == "cuda" or (cfg.device == "auto" and torch.cuda.is_available())
    device = torch.device("cuda" if cuda else "cpu")
    if cfg.dtype != "auto":
        return device, _DTYPES[cfg.dtype]
    if device.type == "cpu":
        return device, torch.float32
    return device, _DTYPES.get(model.torch_dtype, torch.bfloat16) if model.torch_dtype != "float32" else torch.bfloat16


def main() -> None:
    cfg = parse_config(VisualConfig, None, os.environ)
    setup_logging(SERVICE_VISUAL, cfg.replica, cfg.log_level, cfg.log_format)
    model = ModelConfig.from_dir(cfg.model_dir)
    if model.vision is None:
        raise SystemExit(f"{cfg.model_dir} has no vision tower: the visual service serves vision-language models")
    device, dtype = _placement(cfg, model)
    if cfg.random_weights:
        log.warning("random weights (benchmark mode): the embeddings are meaningless")
        tower = random_tower(model.vision, model.hidden_size, dtype, device, seed=0)
    else:
        tower = load_tower(cfg.model_dir, model.vision, dtype, device)
    log.info("vision tower %s on %s in %s", model.vision.family, device, str(dtype).removeprefix("torch."))
    link = RedisLink(RedisTarget.of(cfg))
    stop_on_signals(link)
    names = StreamNames(cfg.namespace)
    metrics = VisualMetrics(cfg.replica)
    service = VisualService(
        tower,
        link,
        names,
        cfg.replica,
        ImageStore(link, names, cfg.image_ttl_s),
        cfg.max_batch_images,
        cfg.stream_maxlen,
        metrics,
        BusyPoll.for_host(cfg.busy_poll_ms),
    )
    serve_collector(cfg.metrics_port, VisualCollector(metrics), cfg.served_model_name())
    beat = HeartbeatPublisher(link, names, SERVICE_VISUAL, cfg.replica, info=metrics.heartbeat)
    run_beating("visual", beat, service.run)


if __name__ == "__main__":
    main()
