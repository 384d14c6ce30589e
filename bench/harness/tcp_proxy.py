"""A TCP proxy on loopback that can black-hole its link: what a network partition looks like from both ends.

While cut, connections are still accepted and bytes are still read from both sides, but none is passed on:
neither end sees a refusal or a reset, only silence, as across a partition (a refused connection would tell
the client at once, which no partition does). Healing closes the connections the cut held, as the ends' own
timeouts would have by then, and passes bytes again.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from types import TracebackType
from typing import Self

from bench.harness.ports import free_port

CHUNK = 65536


class BlackHoleProxy:
    """Forwards ``127.0.0.1:<port>`` to ``127.0.0.1:<upstream>``; ``cut()`` and ``heal()`` from any thread."""

    def __init__(self, upstream: int) -> None:
        self.upstream = upstream
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self._cut = False
        self._held: set[asyncio.StreamWriter] = set()  # both ends of every connection open during a cut
        self._loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    # -- control ---------------------------------------------------------------------------------------------------
    def cut(self) -> None:
        self._cut = True

    def heal(self) -> None:
        self._cut = False
        self._loop.call_soon_threadsafe(self._close_held)

    @property
    def is_cut(self) -> bool:
        return self._cut

    # -- the proxy -------------------------------------------------------------------------------------------------
    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        server = self._loop.run_until_complete(asyncio.start_server(self._accept, "127.0.0.1", self.port))
        self._ready.set()
        try:
            self._loop.run_forever()
        finally:
            server.close()
            self._close_held()
            pending = asyncio.all_tasks(self._loop)
            for task in pending:
                task.cancel()
            self._loop.run_until_complete(asyncio.gather(*pending, return_exceptions=True))
            self._loop.run_until_complete(server.wait_closed())
            self._loop.close()

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        with contextlib.suppress(asyncio.CancelledError):  # the proxy closing: nothing to report
            await self._serve(reader, writer)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        upstream: tuple[asyncio.StreamReader, asyncio.StreamWriter] | None = None
        if not self._cut:
            try:
                upstream = await asyncio.open_connection("127.0.0.1", self.upstream)
            except OSError:
                writer.close()
                return
        if upstream is None:  # accepted across the cut: read and drop, until healed or closed
            self._held.add(writer)
            await self._pipe(reader, None)
            self._held.discard(writer)
            writer.close()
            return
        up_reader, up_writer = upstream
        await asyncio.gather(self._pipe(reader, up_writer), self._pipe(up_reader, writer))
        for w in (writer, up_writer):
            with contextlib.suppress(OSError):
                w.close()

    async def _pipe(self, src: asyncio.StreamReader, dst: asyncio.StreamWriter | None) -> None:
        try:
            while data := await src.read(CHUNK):
                if self._cut or dst is None:
                    if dst is not None:
                        self._held.add(dst)
                    continue  # black-holed: read, never passed on
                dst.write(data)
                await dst.drain()
        except (OSError, asyncio.CancelledError):
            pass
        finally:
            if dst is not None:
                with contextlib.suppress(OSError):
                    dst.close()

    def _close_held(self) -> None:
        for writer in list(self._held):
            with contextlib.suppress(OSError):
                writer.close()
        self._held.clear()

    def __enter__(self) -> Self:
        self._thread.start()
        self._ready.wait(10)
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self._loop.call_soon_threadsafe(self._close_held)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)
