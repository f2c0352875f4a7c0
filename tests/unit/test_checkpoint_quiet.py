"""A failed checkpoint write is reported once, by the run: the libraries'
background reports of the same failure are dropped, any other error is kept."""

import asyncio
import gc
import logging

from depthbench.train.checkpoint import Checkpoints

FULL_DISK = ("OUT_OF_RANGE: Failed to write 90397 bytes to file 9: File too large "
             "[os_error_code='27']")


def _unawaited_failure(message: str) -> None:
    """A gathered future that fails and is dropped unretrieved: asyncio logs it
    when it is garbage collected, as Orbax's failed writes are."""
    async def fail():
        raise ValueError(message)

    async def start():
        future = asyncio.gather(fail())
        await asyncio.sleep(0)
        await asyncio.sleep(0)
        return future

    loop = asyncio.new_event_loop()
    try:
        loop.run_until_complete(start())  # the future is dropped right here
        gc.collect()
    finally:
        loop.close()


def test_asyncio_reports_of_a_full_disk_are_dropped_after_close(tmp_path, caplog):
    Checkpoints(tmp_path / "checkpoints").close()
    with caplog.at_level(logging.ERROR, logger="asyncio"):
        _unawaited_failure(FULL_DISK)
        _unawaited_failure("an unrelated failure")
    messages = [r.getMessage() + str(r.exc_info[1] if r.exc_info else "")
                for r in caplog.records if r.name == "asyncio"]
    assert len(messages) == 1, messages
    assert "an unrelated failure" in messages[0]
