"""Images' embeddings in Redis: each under its content hash (streams.py's image key) with a
time-to-live, so an image sent again within it is encoded once. The visual service writes them;
the worker reads them when it takes a request in. Values are ImageEmbedding messages (msgpack:
dtype, shape, bytes); no torch here."""

from __future__ import annotations

from shared.messages import ImageEmbedding, WireError, decode, encode
from shared.redis_link import RedisLink
from shared.streams import StreamNames


class ImageStore:
    def __init__(self, link: RedisLink, names: StreamNames, ttl_s: float = 0.0) -> None:
        """ttl_s: how long what is stored or kept lives on; 0: this store only reads (the worker)."""
        self.link = link
        self.names = names
        self.ttl_ms = round(ttl_s * 1000)

    def keep(self, hashes: list[str]) -> list[bool]:
        """Whether each image's embeddings are stored; those that are live on for another
        time-to-live (one round trip)."""
        if not hashes:
            return []
        assert self.ttl_ms > 0, "a read-only store keeps nothing"

        def run(r) -> list[bool]:
            pipe = r.pipeline(transaction=False)
            for h in hashes:
                pipe.pexpire(self.names.image(h), self.ttl_ms)
            return [bool(x) for x in pipe.execute()]

        return self.link.call(run)

    def put(self, embeddings: dict[str, ImageEmbedding]) -> None:
        if not embeddings:
            return
        assert self.ttl_ms > 0, "a read-only store stores nothing"

        def run(r) -> None:
            pipe = r.pipeline(transaction=False)
            for h, emb in embeddings.items():
                pipe.set(self.names.image(h), encode(emb), px=self.ttl_ms)
            pipe.execute()

        self.link.call(run)

    def get(self, hashes: list[str]) -> dict[str, ImageEmbedding]:
        """The stored embeddings of these images (one round trip); an image whose key expired or
        holds something else is left out."""
        if not hashes:
            return {}
        values = self.link.call(lambda r: r.mget([self.names.image(h) for h in hashes]))
        out: dict[str, ImageEmbedding] = {}
        for h, data in zip(hashes, values, strict=True):
            if data is None:
                continue
            try:
                emb = decode(data)
            except WireError:
                continue
            if isinstance(emb, ImageEmbedding):
                out[h] = emb
        return out
