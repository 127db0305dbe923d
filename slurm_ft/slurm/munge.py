"""MUNGE credentials through libmunge (``libmunge.so.2``, Debian's ``libmunge2``), by ctypes.

MUNGE is the authentication every Slurm host already runs (``AuthType=auth/munge``): a process
asks its local ``munged`` to *encode* a credential carrying its uid/gid (and a payload); any host
sharing the cluster's key can *decode* it, once, within its time-to-live, and learns that uid/gid
and the payload, which the credential's MAC protects. slurm-ft uses it for the history service
(:mod:`slurm_ft.history.service`): the user's ``ft-history`` encodes its query, the controller
decodes it and answers for the uid MUNGE vouches for, exactly the identity Slurm itself trusts.

Shared core: used by ``ft-history`` (any user, login node) and by the history service (root,
controller). Facts from ``munge.h`` (MUNGE 0.5): ``munge_encode``/``munge_decode``, the option
and error numbers below. Replays (a credential decoded twice) and expired or rewound
credentials are refused by ``munged`` itself (errors 15-17).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import threading
from dataclasses import dataclass

from slurm_ft.errors import SlurmFTError

#: munge.h, ``munge_opt_t``
OPT_TTL = 4
OPT_ENCODE_TIME = 6
OPT_SOCKET = 8
OPT_UID_RESTRICTION = 9
#: munge.h, ``munge_err_t`` (those the callers tell apart)
EMUNGE_SUCCESS = 0
EMUNGE_SOCKET = 6
EMUNGE_CRED_EXPIRED = 15
EMUNGE_CRED_REWOUND = 16
EMUNGE_CRED_REPLAYED = 17
EMUNGE_CRED_UNAUTHORIZED = 18

#: Longest credential accepted for decoding (bytes); a query's credential is a few KiB.
MAX_CRED = 65536


class MungeError(SlurmFTError):
    """A credential could not be made or was refused; ``code`` is MUNGE's error number (0: the
    library itself is missing)."""

    def __init__(self, message: str, code: int = 0):
        super().__init__(message)
        self.code = code


@dataclass(frozen=True)
class Credential:
    """What a decoded credential vouches for."""

    uid: int
    gid: int
    #: the payload, as encoded (bytes)
    payload: bytes
    #: when it was encoded (epoch seconds, the encoding host's clock)
    encoded: int


_lib = None
_lock = threading.Lock()


def _library():
    """libmunge, loaded once. Raises :class:`MungeError` when it is not installed."""
    global _lib
    with _lock:
        if _lib is not None:
            return _lib
        lib = None
        for name in ("libmunge.so.2", ctypes.util.find_library("munge")):
            if not name:
                continue
            try:
                lib = ctypes.CDLL(name, use_errno=True)
                break
            except OSError:
                continue
        if lib is None:
            raise MungeError("libmunge is not installed on this host (Debian: apt-get install munge)")
        lib.munge_ctx_create.restype = ctypes.c_void_p
        lib.munge_ctx_create.argtypes = []
        lib.munge_ctx_destroy.restype = None
        lib.munge_ctx_destroy.argtypes = [ctypes.c_void_p]
        lib.munge_ctx_strerror.restype = ctypes.c_char_p
        lib.munge_ctx_strerror.argtypes = [ctypes.c_void_p]
        lib.munge_strerror.restype = ctypes.c_char_p
        lib.munge_strerror.argtypes = [ctypes.c_int]
        lib.munge_encode.restype = ctypes.c_int
        lib.munge_encode.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_void_p, ctypes.c_char_p, ctypes.c_int]
        lib.munge_decode.restype = ctypes.c_int
        lib.munge_decode.argtypes = [ctypes.c_char_p, ctypes.c_void_p, ctypes.POINTER(ctypes.c_void_p),
                                     ctypes.POINTER(ctypes.c_int), ctypes.POINTER(ctypes.c_uint32),
                                     ctypes.POINTER(ctypes.c_uint32)]
        lib.munge_ctx_get.restype = ctypes.c_int      # variadic: the option's pointer is passed as is
        lib.munge_ctx_set.restype = ctypes.c_int
        _libc = ctypes.CDLL(None)
        _libc.free.argtypes = [ctypes.c_void_p]
        _libc.free.restype = None
        lib.free = _libc.free
        _lib = lib
        return lib


def available() -> bool:
    """Whether libmunge can be loaded here."""
    try:
        _library()
        return True
    except MungeError:
        return False


def _context(lib, socket: str | None):
    ctx = lib.munge_ctx_create()
    if not ctx:
        raise MungeError("munge_ctx_create failed (out of memory)")
    if socket is not None:
        lib.munge_ctx_set(ctypes.c_void_p(ctx), ctypes.c_int(OPT_SOCKET), ctypes.c_char_p(socket.encode()))
    return ctx


def _why(lib, ctx, code: int) -> str:
    text = lib.munge_ctx_strerror(ctypes.c_void_p(ctx)) or lib.munge_strerror(code) or b"unknown error"
    return text.decode("ascii", "replace")


def encode(payload: bytes, *, socket: str | None = None, decoder_uid: int | None = None) -> str:
    """A credential for this process's real uid/gid carrying ``payload`` (``munge_encode``, the
    local ``munged``; ``socket``: its socket, default MUNGE's); with ``decoder_uid`` only a process
    of that uid can decode it (``MUNGE_OPT_UID_RESTRICTION``). Raises :class:`MungeError`
    (munged not running: code 6, ``EMUNGE_SOCKET``)."""
    lib = _library()
    ctx = _context(lib, socket)
    try:
        if decoder_uid is not None:
            lib.munge_ctx_set(ctypes.c_void_p(ctx), ctypes.c_int(OPT_UID_RESTRICTION), ctypes.c_uint32(decoder_uid))
        out = ctypes.c_void_p()
        code = lib.munge_encode(ctypes.byref(out), ctypes.c_void_p(ctx), payload, len(payload))
        if code != EMUNGE_SUCCESS:
            raise MungeError(f"munge: {_why(lib, ctx, code)}", code)
        try:
            return ctypes.string_at(out.value).decode("ascii")
        finally:
            lib.free(out)
    finally:
        lib.munge_ctx_destroy(ctypes.c_void_p(ctx))


def decode(cred: str | bytes, *, socket: str | None = None) -> Credential:
    """Validate ``cred`` with the local ``munged`` (``munge_decode``): the uid/gid that made it,
    its payload and encode time. Each credential decodes once (munged's replay cache).
    Raises :class:`MungeError` for anything but a valid, fresh, first-seen credential (code
    15 expired, 16 rewound, 17 replayed, 8-14 not a credential of this cluster's key), or one
    that is not ASCII, holds a NUL or is longer than :data:`MAX_CRED`."""
    raw = cred.encode("ascii", "replace") if isinstance(cred, str) else bytes(cred)
    if not raw or len(raw) > MAX_CRED or b"\0" in raw or not raw.isascii():
        raise MungeError("not a MUNGE credential", 8)
    lib = _library()
    ctx = _context(lib, socket)
    buf, length = ctypes.c_void_p(), ctypes.c_int(0)
    uid, gid = ctypes.c_uint32(), ctypes.c_uint32()
    try:
        code = lib.munge_decode(raw, ctypes.c_void_p(ctx), ctypes.byref(buf), ctypes.byref(length),
                                ctypes.byref(uid), ctypes.byref(gid))
        try:
            payload = ctypes.string_at(buf.value, length.value) if buf.value and length.value > 0 else b""
        finally:
            if buf.value:
                lib.free(buf)
        if code != EMUNGE_SUCCESS:
            raise MungeError(f"munge: {_why(lib, ctx, code)}", code)
        when = ctypes.c_long(0)
        if lib.munge_ctx_get(ctypes.c_void_p(ctx), ctypes.c_int(OPT_ENCODE_TIME), ctypes.byref(when)) != 0:
            raise MungeError("munge: no encode time in the credential", 1)
        return Credential(uid.value, gid.value, payload, int(when.value))
    finally:
        lib.munge_ctx_destroy(ctypes.c_void_p(ctx))
