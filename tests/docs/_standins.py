"""What the docs' examples call your own code, per page: defined before the page runs.

Each name here is one a page's prose says stands for the reader's code (the test
checks that it does), so an example shows only what orbitive asks of you.
"""

from __future__ import annotations

from typing import Final

_CLIENT: Final = '''
class _Connection:
    """A connection of the reader's own protocol: it keeps what is sent to it."""

    def __init__(self):
        self.sent = []

    def send(self, data):
        self.sent.append(data)

    sendall = send

    def close(self):
        self.sent.clear()


def connect():
    return _Connection()


def read_reply(conn):
    return b"reply to " + conn.sent[-1]
'''

#: Page -> the stand-ins it names, as Python source run before its first block.
STANDINS: Final = {
    "leases.md": """
class _Storage:
    def write(self, data, token):
        assert isinstance(token, int)

storage, data = _Storage(), b"invoice 42"
""",
    "store.md": """
def write_results(fencing_token):
    assert fencing_token > 0
""",
    "clients.md": _CLIENT
    + """
request = b"GET /\\r\\n"
""",
    "pool.md": _CLIENT
    + """
REQUEST_SIZE = 16
request_bytes = b"x" * REQUEST_SIZE
my_connections = {}


def run_query(conn, request):
    conn.send(request)
    return b"rows"


def owner_address(node):
    return f"/run/myapp/owner-{node}.sock"


class Overloaded(Exception):
    pass
""",
}
