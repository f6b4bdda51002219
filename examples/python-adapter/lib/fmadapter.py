"""fmadapter: the protocol side of a Firstmate process-event adapter, in Python.

Standard library only. Copy this file into your package's lib/ directory and
call serve(handler) from your entrypoint; docs/protocol.md in the fm repository
describes the wire protocol this module implements (host protocol 1,
capability process-event-adapter/1).

What it does for you:

- reads the one request on stdin strictly: at most 65,536 bytes, UTF-8 without
  a byte-order mark, exactly one JSON document with only JSON whitespace
  around it, no duplicate key, no NaN or Infinity, no unpaired surrogate, no
  unescaped control character, bounded nesting, exactly the schema's keys,
  integers where integers are due;
- answers the handshake from the handler's identity, or refuses it (nothing on
  stdout, one line on stderr, exit 1) when it cannot answer truthfully;
- dispatches invoke to the handler's four operations, echoes the request id,
  checks each result's shape and bounds, and writes one canonical response;
- keeps stdout for the response alone: while your code runs, file descriptor 1
  and sys.stdout point at stderr, so a stray print() cannot break the answer;
- keeps its own stderr lines within a budget (the host refuses more than
  8,192 bytes of stderr and never shows it).
"""

import json
import os
import re
import signal
import sys

MAX_ENVELOPE = 65536
MAX_OUTPUT = 32768
MAX_ESCAPED_OUTPUT = 64696  # the output JSON-escaped must fit every verdict request the host builds from it
MAX_DIAGNOSTIC = 512
MAX_DEPTH = 32
MAX_VERSION = 2 ** 31 - 1  # protocol and capability versions are 1..2^31-1
MAX_SEQUENCE = 2 ** 63 - 1  # the host's sequence counter never wraps past it
LOG_BUDGET = 4096

HANDSHAKE_REQUEST = "firstmate.extension-handshake-request.v1"
HANDSHAKE_RESPONSE = "firstmate.extension-handshake-response.v1"
REQUEST = "firstmate.extension-request.v1"
RESPONSE = "firstmate.extension-response.v1"
CAPABILITY = "process-event-adapter"

OPERATIONS = ("source.poll", "result.classify", "result.terminal", "result.silent")
ERROR_CODES = ("invalid-request", "incompatible", "conflict", "unavailable", "internal")

_DIGEST = re.compile(r"sha256:[0-9a-f]{64}\Z")
_SOURCE_ID = re.compile(r"[A-Za-z0-9_-][A-Za-z0-9._-]{0,63}\Z")
_TOKEN = re.compile(r"[a-z0-9]+([._-][a-z0-9]+)*\Z")
_JSON_WS = " \t\r\n"


class Refused(Exception):
    """An answer with ok=false: code is one of ERROR_CODES."""

    def __init__(self, code, diagnostic, retryable=False):
        super().__init__(diagnostic)
        if code not in ERROR_CODES:
            code = "internal"
        self.code = code
        self.retryable = bool(retryable)
        self.diagnostic = diagnostic


class Unreadable(Exception):
    """Stdin holds no request that can be answered at all."""


# --------------------------------------------------------------------------
# Strict JSON.


def _no_duplicates(pairs):
    obj = {}
    for key, value in pairs:
        if key in obj:
            raise ValueError("duplicate key %r" % key)
        obj[key] = value
    return obj


def _no_constant(name):
    raise ValueError("%s is not JSON" % name)


def _finite(text):
    value = float(text)
    if value in (float("inf"), float("-inf")):
        raise ValueError("number %s is out of range" % text[:20])
    return value


def _check_value(value, depth):
    """Check strings for surrogates and containers for depth: depth is how
    many containers enclose value."""
    if isinstance(value, (dict, list)) and depth >= MAX_DEPTH:
        raise ValueError("nesting deeper than %d" % MAX_DEPTH)
    if isinstance(value, str):
        _check_text(value)
    elif isinstance(value, dict):
        for key, item in value.items():
            _check_text(key)
            _check_value(item, depth + 1)
    elif isinstance(value, list):
        for item in value:
            _check_value(item, depth + 1)


def escaped_len(s):
    """The bytes s takes inside a JSON string as the host escapes it: '"' and
    '\\' and \b \t \n \f \r take 2, other C0 controls 6, every other
    character its UTF-8 length."""
    n = len(s.encode("utf-8"))
    for ch in s:
        if ch in '"\\\b\t\n\f\r':
            n += 1
        elif ch < " ":
            n += 5
    return n


def _check_text(s):
    for ch in s:
        if "\ud800" <= ch <= "\udfff":
            raise ValueError("unpaired surrogate")


def strict_loads(data, limit=MAX_ENVELOPE):
    """Parse bytes as exactly one strict JSON document; raise ValueError."""
    if len(data) > limit:
        raise ValueError("more than %d bytes" % limit)
    if data.startswith(b"\xef\xbb\xbf"):
        raise ValueError("byte-order mark")
    text = data.decode("utf-8")  # strict: invalid UTF-8 raises (a ValueError)
    start = len(text) - len(text.lstrip(_JSON_WS))
    decoder = json.JSONDecoder(object_pairs_hook=_no_duplicates, parse_constant=_no_constant,
                               parse_float=_finite, strict=True)
    try:
        value, end = decoder.raw_decode(text, start)
    except RecursionError:
        raise ValueError("nesting too deep") from None
    if text[end:].strip(_JSON_WS):
        raise ValueError("data after the document at character %d" % end)
    _check_value(value, 0)
    return value


def canonical(value):
    """Encode value as canonical JSON bytes: sorted keys, no whitespace."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False).encode("utf-8")


def _exact(obj, what, keys):
    if not isinstance(obj, dict):
        raise ValueError("%s is not an object" % what)
    if set(obj) != set(keys):
        missing = sorted(set(keys) - set(obj))
        extra = len(set(obj) - set(keys))
        raise ValueError("%s: missing keys %s, %d unknown keys" % (what, missing, extra))


def _int(value):
    return type(value) is int


def _str(value):
    return type(value) is str


def _versions(value, what):
    """Check a list of versions as the host writes one: non-empty, distinct
    integers from 1 to MAX_VERSION."""
    if not isinstance(value, list) or not value or not all(_int(v) and 1 <= v <= MAX_VERSION for v in value) \
            or len(set(value)) != len(value):
        raise ValueError("%s is not a non-empty list of distinct integers from 1 to %d" % (what, MAX_VERSION))


# --------------------------------------------------------------------------
# The handler's identity and the handshake.


class Identity:
    def __init__(self, extension_id, version, adapter_names):
        self.extension_id = extension_id
        self.version = version
        self.adapter_names = list(adapter_names)


def answer_handshake(identity, req):
    """Return the handshake response for req, or raise ValueError."""
    _exact(req, "handshake request", ("schema", "request_id", "host_protocols", "extension_id",
                                      "extension_version", "package_digest", "capability"))
    if req["schema"] != HANDSHAKE_REQUEST:
        raise ValueError("schema is not %s" % HANDSHAKE_REQUEST)
    if not _str(req["request_id"]) or not _DIGEST.match(req["request_id"]):
        raise ValueError("request_id is not sha256:<64 hex>")
    if not _str(req["package_digest"]) or not _DIGEST.match(req["package_digest"]):
        raise ValueError("package_digest is not sha256:<64 hex>")
    _versions(req["host_protocols"], "host_protocols")
    if 1 not in req["host_protocols"]:
        raise ValueError("host protocol 1 is not offered")
    if req["extension_id"] != identity.extension_id or req["extension_version"] != identity.version:
        raise ValueError("the request is for another extension or version")
    cap = req["capability"]
    _exact(cap, "capability", ("name", "versions", "adapter_names"))
    if cap["name"] != CAPABILITY:
        raise ValueError("capability is not %s" % CAPABILITY)
    _versions(cap["versions"], "capability versions")
    if 1 not in cap["versions"]:
        raise ValueError("capability version 1 is not offered")
    names = cap["adapter_names"]
    if not isinstance(names, list) or not names or not all(_str(n) for n in names) or len(set(names)) != len(names):
        raise ValueError("adapter_names is not a non-empty list of distinct names")
    for name in names:
        if name not in identity.adapter_names:
            raise ValueError("adapter %r is not provided by this package" % name)
    return {
        "schema": HANDSHAKE_RESPONSE,
        "request_id": req["request_id"],
        "extension_id": identity.extension_id,
        "extension_version": identity.version,
        "host_protocol": 1,
        "capability": CAPABILITY,
        "capability_version": 1,
        "adapter_names": list(names),
    }


# --------------------------------------------------------------------------
# Invoke.


class Call:
    """What an operation is called with: the request and the environment."""

    def __init__(self, req, env, log):
        self.request_id = req["request_id"]
        self.adapter = req["adapter"]
        self.operation = req["operation"]
        self.package_digest = req["package_digest"]
        # FIRSTMATE_EXTENSION_STATE: the package's private (0700) directory,
        # the only place it may write. The package root is read-only.
        self.state_dir = env.get("FIRSTMATE_EXTENSION_STATE", "")
        self.log = log


def _diagnostic(text):
    text = re.sub(r"[\t\n\r]", " ", str(text))
    text = "".join(ch for ch in text if not (ord(ch) < 0x20 or 0x7F <= ord(ch) <= 0x9F or "\ud800" <= ch <= "\udfff"))
    raw = text.encode("utf-8")[:MAX_DIAGNOSTIC]
    text = raw.decode("utf-8", "ignore")
    return text or "failed"


def _failure(request_id, code, diagnostic, retryable):
    return {
        "schema": RESPONSE,
        "request_id": request_id,
        "ok": False,
        "result": None,
        "error": {"code": code, "retryable": bool(retryable), "diagnostic": _diagnostic(diagnostic)},
    }


def peek_request_id(data):
    """Return the request id of an invoke request, or raise Unreadable."""
    try:
        req = strict_loads(data)
    except ValueError as e:
        raise Unreadable("request: %s" % e) from None
    rid = req.get("request_id") if isinstance(req, dict) else None
    if not _str(rid) or not _DIGEST.match(rid):
        raise Unreadable("request: no well-formed request_id")
    return req, rid


def _check_request(identity, req):
    _exact(req, "request", ("schema", "request_id", "host_protocol", "extension_id", "extension_version",
                            "package_digest", "capability", "capability_version", "adapter", "operation", "input"))
    if req["schema"] != REQUEST:
        raise Refused("invalid-request", "schema is not %s" % REQUEST)
    if not _str(req["package_digest"]) or not _DIGEST.match(req["package_digest"]):
        raise Refused("invalid-request", "package_digest is not sha256:<64 hex>")
    if not _int(req["host_protocol"]) or not _int(req["capability_version"]):
        raise Refused("invalid-request", "host_protocol and capability_version must be integers")
    if req["host_protocol"] != 1 or req["capability"] != CAPABILITY or req["capability_version"] != 1:
        raise Refused("incompatible", "not host protocol 1 and %s/1" % CAPABILITY)
    if req["extension_id"] != identity.extension_id or req["extension_version"] != identity.version:
        raise Refused("incompatible", "the request is for another extension or version")
    if req["adapter"] not in identity.adapter_names:
        raise Refused("incompatible", "adapter is not provided by this package")
    if req["operation"] not in OPERATIONS:
        raise Refused("incompatible", "unknown operation")
    inp = req["input"]
    if req["operation"] == "source.poll":
        _exact(inp, "input", ("source_id", "config_ref"))
        ref = inp["config_ref"]
        if not _str(ref) or not 1 <= len(ref.encode("utf-8")) <= 512 or any(
                ord(ch) < 0x20 or 0x7F <= ord(ch) <= 0x9F for ch in ref):
            raise Refused("invalid-request", "config_ref is not one line of 1..512 bytes")
    else:
        _exact(inp, "input", ("source_id", "sequence", "content"))
        if not _int(inp["sequence"]) or not 1 <= inp["sequence"] <= MAX_SEQUENCE:
            raise Refused("invalid-request", "sequence is not an integer from 1 to %d" % MAX_SEQUENCE)
        if not _str(inp["content"]) or len(inp["content"].encode("utf-8")) > MAX_OUTPUT:
            raise Refused("invalid-request", "content is not a string of at most %d bytes" % MAX_OUTPUT)
    if not _str(inp["source_id"]) or not _SOURCE_ID.match(inp["source_id"]):
        raise Refused("invalid-request", "source_id is not [A-Za-z0-9._-]{1,64} without a leading dot")
    return inp


def _check_result(operation, result):
    if operation == "source.poll":
        _exact(result, "source.poll result", ("status", "output"))
        out = result["output"]
        if result["status"] == "no-result" and out == "":
            return
        if result["status"] != "result" or not _str(out) or not 1 <= len(out.encode("utf-8")) <= MAX_OUTPUT:
            raise ValueError("source.poll result must be status result with 1..%d bytes, or no-result" % MAX_OUTPUT)
        if escaped_len(out) > MAX_ESCAPED_OUTPUT:
            raise ValueError("source.poll output takes %d bytes JSON-escaped, more than %d" % (escaped_len(out), MAX_ESCAPED_OUTPUT))
        _check_text(out)
    elif operation == "result.classify":
        _exact(result, "classification", ("classification",))
        c = result["classification"]
        if not _str(c) or len(c) > 64 or not _TOKEN.match(c):
            raise ValueError("classification is not a lower-case token of 1..64 bytes")
    else:
        _exact(result, operation + " result", ("value",))
        if type(result["value"]) is not bool:
            raise ValueError("value is not a boolean")


def respond(identity, handler, req, rid, env, log):
    """Return the canonical response bytes to the invoke request req."""
    try:
        try:
            inp = _check_request(identity, req)
        except ValueError as e:
            raise Refused("invalid-request", str(e)) from None
        call = Call(req, env, log)
        op = req["operation"]
        method = getattr(handler, {"source.poll": "poll", "result.classify": "classify",
                                   "result.terminal": "terminal", "result.silent": "silent"}[op])
        result = method(call, inp)
        try:
            _check_result(op, result)
        except ValueError as e:
            raise Refused("internal", "the handler returned an invalid result: %s" % e) from None
        out = canonical({"schema": RESPONSE, "request_id": rid, "ok": True, "result": result, "error": None})
        if len(out) > MAX_ENVELOPE:
            raise Refused("internal", "the response would be %d bytes, more than %d" % (len(out), MAX_ENVELOPE))
        return out
    except Refused as e:
        return canonical(_failure(rid, e.code, e.diagnostic, e.retryable))
    except Exception as e:  # a bug in the handler: answer internal, never crash
        log("adapter: %s failed: %s: %s" % (req.get("operation"), type(e).__name__, e))
        return canonical(_failure(rid, "internal", "%s: %s" % (type(e).__name__, e), False))


# --------------------------------------------------------------------------
# The entrypoint.


class _Log:
    """Lines on stderr within LOG_BUDGET bytes; the rest is dropped."""

    def __init__(self, stream):
        self.stream = stream
        self.left = LOG_BUDGET

    def __call__(self, line):
        data = (_diagnostic(line) + "\n").encode("utf-8")
        if len(data) > self.left:
            self.left = 0
            return
        self.left -= len(data)
        try:
            self.stream.write(data)
            self.stream.flush()
        except (OSError, ValueError):  # ValueError: a closed stream
            pass


_stop = False


def stopping():
    """True once the host sent SIGTERM or SIGINT (timeout or shutdown)."""
    return _stop


def _on_signal(signum, frame):
    global _stop
    _stop = True


def _guard_stdout():
    """Move the response channel off fd 1; return a binary stream for it.

    The response goes out on a private, non-inheritable duplicate of the real
    stdout; fd 1 then points at stderr, and sys.stdout is a stream of its own
    on a duplicate of that, so print() in a handler or a child process
    writing to its stdout lands on stderr instead of corrupting the one
    response document, and a handler that closes sys.stdout does not close
    stderr. Nothing points fd 1 back: a thread still printing after serve
    returns writes to stderr too.
    """
    private = os.dup(1)  # os.dup makes it non-inheritable: children never get it
    os.dup2(2, 1)
    sys.stdout = open(os.dup(1), "w", buffering=1, encoding=sys.stderr.encoding, errors=sys.stderr.errors)
    return os.fdopen(private, "wb")


def serve(identity, handler, argv=None, stdin=None, env=None, stdout=None, stderr=None):
    """Run the entrypoint: dispatch argv[1], answer, and return the exit status.

    With stdout None (the entrypoint), the response goes to the process's
    stdout, guarded as _guard_stdout says, and SIGTERM and SIGINT set
    stopping(). A test passes binary streams instead: the response is written
    to stdout and the log to stderr, and neither fd 1, sys.stdout nor the
    signal handlers of the process are touched, so serve can be called again.
    """
    argv = sys.argv if argv is None else argv
    env = os.environ if env is None else env
    errstream = sys.stderr.buffer if stderr is None else stderr
    if len(argv) != 2 or argv[1] not in ("handshake", "invoke"):
        errstream.write(b"usage: firstmate-extension handshake|invoke\n")
        return 2
    log = _Log(errstream)
    pid = os.getpid()
    if stdout is None:
        signal.signal(signal.SIGTERM, _on_signal)
        signal.signal(signal.SIGINT, _on_signal)
        response = _guard_stdout()
    else:
        response = stdout
    data = (stdin if stdin is not None else sys.stdin.buffer).read(MAX_ENVELOPE + 1)
    if argv[1] == "handshake":
        try:
            out = canonical(answer_handshake(identity, strict_loads(data)))
        except ValueError as e:
            log("adapter: handshake refused: %s" % e)
            return 1
    else:
        try:
            req, rid = peek_request_id(data)
        except Unreadable as e:
            log("adapter: invoke refused: %s" % e)
            return 1
        out = respond(identity, handler, req, rid, env, log)
        if os.getpid() != pid:
            # A process the handler forked that returned from it too: only
            # the entrypoint answers, once.
            log("adapter: a process forked by the handler returned from it; it exits without answering")
            os._exit(0)
    response.write(out)
    response.flush()
    return 0
