"""The worker's wire format and the checks on everything it reads.

Every message is one JSON header line. From the pool, a header with `"body": N` is followed by N raw
bytes the worker takes as they are: the environment payload of `load`, the arguments of `call`. So
the worker never parses a multi-megabyte state or argument on its event loop: it forks the payload
into a zygote, and splices the arguments into the line it sends the session.

    pool -> worker   {"id", "op": "hello"|"ping"|"load"|"unload"|"open"|"call"|"close", ...} [+ body]
    worker -> pool   {"id", "ok": ...} | {"id", "outcome", "output", "error", "traceback", "truncated"}
                     | {"id", "failure": FAILURE, "error"}    (the sandbox failed, not the tool)
                     | {"calm": [cores]}   (no request's: where the worker and its sessions not pinned run
                                            while a session is pinned, [] once none is: `sessions._keep_calm`)
    worker -> session  {"nonce", "tool", "args"}   (the arguments spliced in as the pool sent them, unparsed)
    session -> worker  {"nonce", "ready": true} | {"nonce", "ready": false, "error"}
                     | {"nonce", "outcome", "output", "error", "traceback", "truncated"}

Session replies are untrusted: the tool code runs in the same process as the code that writes
them. `session_reply` accepts only a reply to the call in flight (its nonce, a fresh random number
per call), with a known outcome, text fields that are strings within their caps and valid UTF-8.
Anything else is dropped or turned into an error observation; nothing a session sends can stop
the worker. Standard library only, like the rest of the worker.
"""

import json

# A session may report these; "timeout" is the worker's own measurement, never a session's claim.
SESSION_OUTCOMES = frozenset({"ok", "no_output", "error", "limit"})
# Why the sandbox (not the tool) failed a request; the pool raises a typed EnvironmentFailure for each.
FAILURES = frozenset({"overloaded", "state_lost", "isolation", "spawn"})
MAX_HEADER = 1 << 16  # bytes of one header line
TRUNCATED = "\n...[truncated: {} more bytes]"


class ProtocolError(ValueError):
    """Bytes that are not a message of this protocol."""


def clean(text: str, limit: int, dropped: int = 0) -> tuple[str, bool]:
    """`text` as valid UTF-8 (a lone surrogate, which json.loads accepts from "\\ud800", becomes U+FFFD), cut to at
    most `limit` bytes plus a marker saying how much was dropped (`dropped` more were dropped before); and whether cut."""
    try:
        data = text.encode("utf-8")
    except UnicodeEncodeError:  # rare: pay for the round trip only then
        text = text.encode("utf-16", "surrogatepass").decode("utf-16", "replace")
        data = text.encode("utf-8")
    if len(data) <= limit and not dropped:
        return text, False
    return data[:limit].decode("utf-8", "ignore") + TRUNCATED.format(max(0, len(data) - limit) + dropped), True


def encode(msg: dict) -> bytes:
    """One JSON line. Every string in `msg` must be clean (`clean`) already."""
    return (json.dumps(msg, ensure_ascii=False, separators=(",", ":")) + "\n").encode("utf-8")


class Reader:
    """Cuts a byte stream into (header, body) messages; `max_body` bounds what a header may announce."""

    def __init__(self, max_body: int) -> None:
        self.buf = bytearray()
        self.max_body = max_body
        self.head: dict | None = None  # a header whose body has not fully arrived

    def feed(self, data: bytes) -> list[tuple[dict, bytes]]:
        self.buf += data
        out: list[tuple[dict, bytes]] = []
        while True:
            if self.head is None:
                cut = self.buf.find(b"\n")
                if cut < 0:
                    if len(self.buf) > MAX_HEADER:
                        raise ProtocolError("a header line longer than the limit")
                    return out
                line = bytes(self.buf[:cut])
                del self.buf[: cut + 1]
                if not line.strip():
                    continue
                try:
                    head = json.loads(line)
                except (ValueError, RecursionError) as err:
                    raise ProtocolError(f"a header that is not JSON: {err}") from None
                if not isinstance(head, dict):
                    raise ProtocolError("a header that is not an object")
                size = head.get("body", 0)
                if not isinstance(size, int) or not 0 <= size <= self.max_body:
                    raise ProtocolError(f"a body of {size!r} bytes (limit {self.max_body})")
                self.head = head
            size = self.head.get("body", 0)
            if len(self.buf) < size:
                return out
            body = bytes(self.buf[:size])
            del self.buf[:size]
            out.append((self.head, body))
            self.head = None


def session_reply(line: bytes, nonce: int, limit: int) -> dict | None:
    """The validated reply to the call with `nonce`, or None when `line` is not one (dropped).

    A line with the right nonce but a broken shape is the tool code's doing: it becomes an error
    observation, never an exception. Text fields are re-capped here, whatever the session claimed.
    """
    try:
        msg = json.loads(line)
    except (ValueError, RecursionError):  # not JSON, not UTF-8, or nested past the parser's limit
        return None
    if not isinstance(msg, dict) or msg.get("nonce") != nonce or type(msg.get("nonce")) is not int:
        return None
    if "ready" in msg:
        error = msg.get("error")
        return {"ready": msg["ready"] is True, "error": clean(error, 4 * limit)[0] if isinstance(error, str) else None}
    outcome = msg.get("outcome")
    texts = [msg.get(k) for k in ("output", "error", "traceback")]
    if outcome not in SESSION_OUTCOMES or not all(t is None or isinstance(t, str) for t in texts):
        return {"outcome": "error", "output": "", "traceback": None, "truncated": False,
                "error": "the session sent an invalid reply (tool code wrote into its reply channel)"}
    output, cut_out = clean(texts[0] or "", limit + len(TRUNCATED) + 24)
    error = clean(texts[1], limit)[0] if texts[1] is not None else None
    trace = clean(texts[2], limit)[0] if texts[2] is not None else None
    return {"outcome": outcome, "output": output, "error": error, "traceback": trace,
            "truncated": msg.get("truncated") is True or cut_out}
