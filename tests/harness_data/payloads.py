"""The payloads generate.py hands pydantic-ai-harness, which the tests expect back (imported by both)."""

IMAGE = b'\x89PNG\r\n\x1a\n' + bytes(range(256)) * 320
"""Above the harness's default media threshold (64 KiB): externalized as a binary blob."""
ICON = b'GIF89a' + bytes(range(64))
"""Below the threshold: kept inline."""
REPORT = 'lorem ipsum dolor sit amet ' * 2600
"""A tool's text return above the threshold: externalized as a text blob."""
OLD_IMAGE = b'\xff\xd8\xff\xe0' + bytes(reversed(range(256))) * 300
"""The older release's image: its marker is the older binary shape."""

CONVERSATION = 'orch-conv'
CRASHED_RUN = 'deploy-crash-1'
