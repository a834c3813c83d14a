"""Redis I/O off the step loop: a thread that reads the inbox and one that sends and acks.

The step loop only touches in-process queues, so a slow or absent Redis never stalls
a GPU step; the outbox keeps the order in which messages were handed to it.

Handing a message to an idle outbox thread waits (at most HAND_OFF_S) until that thread
has taken it. The step loop is Python that rarely lets go of the interpreter lock before
it waits for the device, so without this the thread would get to send a step's tokens
only then, up to a step later; while the loop waits here, the thread takes the lock and
starts sending at once. The inbox does the same the other way: entries for a step loop
that waits for them are handed over before the thread goes back to Redis, so the loop
runs at once instead of after the thread's next read has started.

A small job for an idle outbox (a step of a few requests) may be sent by the step loop
itself (at_once): at low load the loop has the device's step time to spare, and waking
the outbox thread, then the loop again, costs a lone request's first token more than the
send. A send that cannot be made at once goes to the thread, in order.
"""

from __future__ import annotations

import logging
import queue
import threading
from typing import Any

from shared.redis_link import NotAtOnce, Stopping
from shared.redis_streams import Entry, StreamReader, StreamWriter

log = logging.getLogger(__name__)

HAND_OFF_S = 0.002  # the longest the step loop waits for an idle outbox thread to take a message


class Inbox:
    def __init__(self, reader: StreamReader, stop: threading.Event) -> None:
        self.reader = reader
        self.stop = stop
        self.queue: queue.Queue[Entry] = queue.Queue()
        self._thread = threading.Thread(target=self._run, name="inbox", daemon=True)
        self._waiting = False  # the step loop waits in drain for the first entry
        self._taken = threading.Event()  # the waiting step loop has taken what was put

    def start(self) -> Inbox:
        self._thread.start()
        return self

    def drain(self, wait_s: float = 0.0) -> list[Entry]:
        """Everything received so far; waits up to wait_s for the first entry when empty."""
        out: list[Entry] = []
        try:
            if wait_s > 0:
                self._waiting = True
                try:
                    out.append(self.queue.get(timeout=wait_s))
                finally:
                    self._waiting = False
                    self._taken.set()
            else:
                out.append(self.queue.get_nowait())
        except queue.Empty:
            return out
        while True:
            try:
                out.append(self.queue.get_nowait())
            except queue.Empty:
                return out

    def _run(self) -> None:
        while not self.stop.is_set():
            try:
                entries = self.reader.read(count=256, block_ms=500)
                if entries:
                    waiting = self._waiting
                    self._taken.clear()
                    for entry in entries:
                        self.queue.put(entry)
                    if waiting:
                        self._taken.wait(HAND_OFF_S)
            except Stopping:
                return
            except Exception:
                log.exception("inbox read failed; retrying")
                self.stop.wait(0.5)


class Outbox:
    def __init__(self, writer: StreamWriter, stop: threading.Event) -> None:
        self.writer = writer
        self.stop = stop
        self.queue: queue.Queue[tuple[list[tuple[str, Any]], list[Entry]] | None] = queue.Queue()
        self._thread = threading.Thread(target=self._run, name="outbox", daemon=True)
        self._idle = False  # the thread waits for a job
        self._taken = threading.Event()  # the thread has taken the last job handed to it

    def start(self) -> Outbox:
        self._thread.start()
        return self

    def send(self, items: list[tuple[str, Any]], acks: list[Entry] | None = None, at_once: bool = False) -> None:
        if not items and not acks:
            return
        idle = self._idle
        if at_once and idle and self.queue.empty() and self._sent_at_once(items, acks or []):
            return
        self._taken.clear()
        self.queue.put((items, acks or []))
        if idle and items:  # acknowledgements alone are not worth the wait
            self._taken.wait(HAND_OFF_S)

    def _sent_at_once(self, items: list[tuple[str, Any]], acks: list[Entry]) -> bool:
        """Send from the calling thread (nothing is queued nor being sent, so the order holds);
        False to hand the job to the thread instead. A failure is what the thread's would be."""
        try:
            self.writer.send_many(items, acks=acks, once=True)
        except NotAtOnce:
            return False
        except Exception:
            log.exception("send failed; %d messages lost", len(items))
        return True

    def close(self, timeout_s: float = 5.0) -> None:
        """Send what is queued, then stop."""
        self.queue.put(None)
        self._thread.join(timeout_s)

    def _run(self) -> None:
        while True:
            self._idle = True
            job = self.queue.get()
            self._idle = False
            self._taken.set()
            if job is None:
                return
            items, acks = job
            try:
                self.writer.send_many(items, acks=acks)
            except Stopping:
                return
            except Exception:
                log.exception("outbox send failed; %d messages lost", len(items))
