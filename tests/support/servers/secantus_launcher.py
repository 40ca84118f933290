"""`secantusd-py` for the tests: SecantusDB keeping the replies of its last 200 retryable writes, not 10,000.

Usage: python secantus_launcher.py ARGS... (the arguments of `secantusd-py`).

SecantusDB (0.7.0b3) keeps the reply of every retryable write (each write of a pymongo client, by
default) for 30 minutes, up to 10,000 of them, and scans them all on every write, sorting them once
there are 10,000: a session's server got slower with every test (a test late in the session took
ten times as long as on a fresh server, the scan being 80% of the server's time). A driver retries
a write at once, after a network error, so the last 200 replies are all a retry can ask for.
"""

from __future__ import annotations

import sys

import secantus.transactions
from secantus.cli import main

RETRYABLE_REPLIES_KEPT = 200

if __name__ == '__main__':
    secantus.transactions._RETRYABLE_RECORD_MAX = RETRYABLE_REPLIES_KEPT  # read on every write
    sys.exit(main())
