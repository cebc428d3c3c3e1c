"""Slow, self-contained parts of a test session (the install guide on hosts of its own,
the Vagrant cluster) run in a thread of their own, started by tests/conftest.py once the
test cluster is built, so they go on while the integration tests run; the test that
checks one waits for its outcome (``result()``, which starts it when nobody did)."""

import threading


class Background:
    """``run()`` (a subclass's) once, in a thread; ``result()`` is its return value, or
    raises what it raised."""

    name = "background"

    def __init__(self):
        self.thread = None
        self._value = None
        self._error = None

    def run(self):
        raise NotImplementedError

    def start(self, after=None):
        """Run once ``after`` (a thread, or None) has ended; a second start does nothing."""
        if self.thread is None:
            self.thread = threading.Thread(target=self._main, args=(after,), name=self.name,
                                            daemon=True)
            self.thread.start()

    def _main(self, after):
        if after is not None:
            after.join()
        try:
            self._value = self.run()
        except BaseException as exc:  # pylint: disable=broad-except  (pytest's Failed too)
            self._error = exc

    def result(self):
        self.start()
        self.thread.join()
        if self._error is not None:
            raise self._error
        return self._value
