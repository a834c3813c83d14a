"""Redis I/O around the step loop: a thread that reads the inbox and one that sends and acks.

Under load the step loop only touches in-process queues, so a slow or absent Redis never
stalls a GPU step; the outbox keeps the order in which messages were handed to it. With
few requests the loop's own reads and sends are single attempts on a short-timeout
connection (RedisLink.call_once) that hand the work to the threads when Redis does not
answer at once.

Handing a message to an idle outbox thread waits (at most HAND_OFF_S) until that thread
has taken it. The step loop is Python that rarely lets go of the interpreter lock before
it waits for the device, so without this the thread would get to send a step's tokens
only then, up to a step later; while the loop waits here, the thread takes the lock and
starts sending at once. The inbox thread reads only while the loop holds many requests:
with few, the loop reads for itself, so an admission reaches it directly.

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

from shared.busy_poll import BusyPoll
from shared.redis_link import NotAtOnce, Stopping
from shared.redis_streams import Entry, StreamReader, StreamWriter

log = logging.getLogger(__name__)

HAND_OFF_S = 0.002  # the longest the step loop waits for an idle outbox thread to take a message
THREAD_READ_MS = 500  # the inbox thread's blocking read (Redis ends a BLOCK on its own clock, 100 ms at hz 10)


class Inbox:
    """Admissions and aborts in, in the order they were sent.

    With many requests the inbox thread reads them into a queue that the step loop drains
    between steps, so the loop never spends a round trip on Redis. With few (or none), the
    loop reads for itself: a read that does not wait after each step (hidden behind the
    device's step, which takes longer than a few requests' host work), and, when idle, a
    read that waits, polling in the window (shared/busy_poll.py). What arrives then goes
    straight to the loop, with no thread to wake and hand over; and a polling thread would
    take the interpreter from the steps. Whichever reads holds the turn, so the two never
    read at once and the order holds. A loop that wants the turn back takes it when the
    thread's read ends; until then it drains the queue."""

    def __init__(self, reader: StreamReader, stop: threading.Event, poll: BusyPoll | None = None) -> None:
        self.reader = reader
        self.stop = stop
        self.poll = poll or BusyPoll(0.0)
        self.queue: queue.Queue[Entry] = queue.Queue()
        self._thread = threading.Thread(target=self._run, name="inbox", daemon=True)
        self._turn = threading.Lock()  # held by whichever of the thread and the loop reads
        self._thread_reads = threading.Event()  # many requests: the thread reads

    def start(self) -> Inbox:
        self._thread.start()
        return self

    def thread_reads(self, yes: bool) -> None:
        """Many requests (yes): the thread reads; else the loop does, from its next drain."""
        if yes:
            self._thread_reads.set()
        else:
            self._thread_reads.clear()

    @property
    def loop_reads(self) -> bool:
        """The loop reads the inbox itself (few requests), not the thread."""
        return not self._thread_reads.is_set()

    def drain(self, wait_s: float = 0.0) -> list[Entry]:
        """Everything received so far. When the loop reads for itself, one read that waits up
        to wait_s (0: does not wait)."""
        return self.drain_acking(wait_s, [])[0]

    def drain_acking(self, wait_s: float, acks: list[Entry]) -> tuple[list[Entry], list[Entry]]:
        """What drain returns, and the entries of ``acks`` (taken in earlier) not yet
        acknowledged: a read the loop makes itself acknowledges them in its own round trip,
        so that a lone request's admission costs no hand-off to the outbox thread between its
        prefill's step and the next. The loop's read that does not wait spins on the answer
        when the polls do (BusyPoll.spin)."""
        out = self._queued()
        if out or self._thread_reads.is_set():
            return out, acks
        if not self._turn.acquire(timeout=max(wait_s, 0.0)):
            return self._queued(), acks  # the thread's last read has not ended
        try:
            out = self._queued()  # what the thread read last
            if out:
                return out, acks
            if wait_s > 0:
                return self.poll.read(self.reader, count=256, block_ms=max(1, round(wait_s * 1000)), acks=acks), []
            return self.reader.read(count=256, acks=acks, once=True, spin=self.poll.spin and self.poll.polling()), []
        except NotAtOnce:  # Redis did not answer at once: the thread, with its retries, reads for now
            self._thread_reads.set()
        except Stopping:
            pass
        except Exception:
            log.exception("inbox read failed; retrying")
        finally:
            self._turn.release()
        return out, acks  # acknowledging an entry twice is harmless, so a failed read's go again

    def _queued(self) -> list[Entry]:
        out: list[Entry] = []
        while True:
            try:
                out.append(self.queue.get_nowait())
            except queue.Empty:
                return out

    def _run(self) -> None:
        while not self.stop.is_set():
            if not self._thread_reads.wait(0.5):
                continue
            try:
                with self._turn:
                    if not self._thread_reads.is_set():
                        continue  # the loop took the reading back while this thread waited for the turn
                    # queued under the turn, so the loop, once it holds it, sees them first
                    for entry in self.reader.read(count=256, block_ms=THREAD_READ_MS):
                        self.queue.put(entry)
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
