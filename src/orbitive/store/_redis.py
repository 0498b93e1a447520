"""Redis engine (``redis://``, ``rediss://``, ``unix://``): named locks on one Redis node.

Facts this engine relies on:

* A lease is one string key ``{prefix}lock:{name}`` holding ``"TOKEN ATTEMPT
  OWNER"``; its ``PX`` expiry *is* the lease. The server expires it on its own
  clock, and ``PEXPIRETIME`` (Redis 7.0 or later) gives ``expires_at``: Unix
  epoch seconds of the server, whole milliseconds, the same on every read. No
  client clock is ever compared.
* A Lua script runs atomically. The grant reads the key, draws the fencing
  token with ``INCR {prefix}fence`` and writes the lease with ``SET NX PX``, in
  one step; renew and release compare the whole stored value (token, attempt
  and owner) in Lua before they touch the key, so they act on the exact tenure.
* The counter ``{prefix}fence`` never goes back while the server keeps its data,
  so tokens strictly increase. A failover to a replica that missed the last
  writes, or a restart without persistence, can forget a lease and reuse a
  token: a single node guarantees exclusion only while it keeps its data.
* A call carries an attempt id (see ``_remote``): the grant stores it in the
  value, release and force-release leave a receipt ``{prefix}receipt:{attempt}``
  that lives :data:`RECEIPT_MIN_S` seconds or three call timeouts, whichever is
  longer. A retry after a lost reply reports what the first attempt did.
* The engine owns one redis-py ``Connection`` per process (built by the URL's
  pool class, so TCP, TLS and Unix sockets alike), used by one thread at a time
  under a mutex, as the PostgreSQL engine does: a command is one
  ``send_command`` and one ``read_response``, without the client's pool and
  instrumentation on every call. redis-py's own retries are switched off (a
  blind retry of a grant could change its answer); a connection error
  disconnects it and the call is retried once, the same ``Connection``
  connecting afresh. Each socket step (connect, command) is bounded by a
  quarter of the call timeout, so two attempts of connect plus command fit.
* The pool counts every ``Connection`` it makes against its limit and forgets
  one only when it is released to it, which the engine never does: so the
  engine makes exactly one per process (two with semaphore waiters, see below),
  never one per reconnect (one per
  reconnect ran out of the limit after about 50 failed calls, and every call
  after was refused with "Too many connections").
* ``locks()`` walks the prefix with ``SCAN`` and reads each batch of keys in
  one script: every lease live through the whole walk is listed once (SCAN may
  return a key twice; the engine keeps one), one granted or released during it
  may or may not be.
* Scripts are loaded at open and run by ``EVALSHA``; a server that forgot them
  (restart, ``SCRIPT FLUSH``) answers NOSCRIPT and gets the script again.
* After ``fork`` the child drops the inherited connection: redis-py closes its
  socket without ``shutdown`` in a process other than its creator, so the
  parent's session lives on; the child makes its own on first use.
* A semaphore is one hash ``{prefix}sem:{name}``: the field ``limit`` holds the
  limit its holders were granted under, and each held slot is a field (its
  number) holding ``"EXPIRES_MS TOKEN ATTEMPT OWNER"``. A hash field has no
  expiry of its own before Redis 7.4, so the scripts read the server's clock
  (``TIME``) and compare; the grant deletes the lapsed fields it meets, and the
  key expires (``PEXPIREAT``) when its last lease would. Each script runs
  atomically, so the count, the limit check and the choice of the lowest free
  slot see every earlier grant; tokens come from the same ``{prefix}fence``.
* A release of semaphore units publishes the name on the channel
  ``{prefix}semaphores``; the engine's subscribed connection (see
  ``_notifications``) wakes the waiters of that name. Pub/Sub needs no server
  setting, unlike keyspace notifications (which are Pub/Sub messages too).
  The subscribed connection is the engine's second ``Connection``, also made
  once per process and reconnected in place.
"""

from __future__ import annotations

import hashlib
import math
import re
import threading
import time
from collections.abc import Iterator, Sequence
from types import ModuleType
from typing import TYPE_CHECKING, Any, Final, NamedTuple

from .._core import _fork
from .._core._errors import ErrorKind, InvalidStoreUrl, StoreError
from ._engine import Busy, Engine, LockInfo, SlotInfo, limit_mismatch
from ._health import Reachability
from ._network import Deadline, attempt_id, gave_up, timed_out
from ._notifications import Notifications, Subscription

if TYPE_CHECKING:
    from redis.connection import ConnectionPool

#: Key prefix of every lease, counter and receipt unless the URL gives ``?prefix=``.
PREFIX_DEFAULT: Final = "orbitive:"
#: Oldest server the scripts run on (``PEXPIRETIME`` came with 7.0).
SERVER_MIN: Final = (7, 0)
#: Shortest life of a release receipt, in seconds.
RECEIPT_MIN_S: Final = 60.0
#: Keys read per SCAN step of :meth:`RedisEngine.locks`.
_SCAN_COUNT: Final = 512
# KEYS[1] lease key, KEYS[2] fence counter; ARGV[1] owner, ARGV[2] ttl ms, ARGV[3] attempt.
# -> {granted 0|1, token, owner, expires_at ms, remaining ms}; granted 1 for a live lease
# of this very attempt (a retry whose first try committed).
_ACQUIRE: Final = """
local held = redis.call('GET', KEYS[1])
if held then
    local token, attempt, owner = string.match(held, '^(%d+) (%x+) (.*)$')
    if not token then
        return redis.error_reply('orbitive: ' .. KEYS[1] .. ' does not hold a lease')
    end
    local expires = redis.call('PEXPIRETIME', KEYS[1])
    local left = redis.call('PTTL', KEYS[1])
    return {attempt == ARGV[3] and 1 or 0, tonumber(token), owner, expires, left}
end
local token = redis.call('INCR', KEYS[2])
local value = string.format('%d %s %s', token, ARGV[3], ARGV[1])
redis.call('SET', KEYS[1], value, 'NX', 'PX', ARGV[2])
return {1, token, ARGV[1], redis.call('PEXPIRETIME', KEYS[1]), tonumber(ARGV[2])}
"""
# KEYS[1] lease key; ARGV[1] the tenure's value, ARGV[2] ttl ms -> expires_at ms, or nil.
_RENEW: Final = """
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return false end
redis.call('PEXPIRE', KEYS[1], ARGV[2])
return redis.call('PEXPIRETIME', KEYS[1])
"""
# KEYS[1] lease key, KEYS[2] receipt; ARGV[1] the tenure's value, ARGV[2] receipt ms -> 0|1.
_RELEASE: Final = """
if redis.call('GET', KEYS[1]) == ARGV[1] then
    redis.call('DEL', KEYS[1])
    redis.call('SET', KEYS[2], '1', 'PX', ARGV[2])
    return 1
end
return redis.call('EXISTS', KEYS[2])
"""
# KEYS[1] lease key, KEYS[2] receipt; ARGV[1] receipt ms -> 0|1.
_FORCE: Final = """
if redis.call('DEL', KEYS[1]) == 1 then
    redis.call('SET', KEYS[2], '1', 'PX', ARGV[1])
    return 1
end
return redis.call('EXISTS', KEYS[2])
"""
# KEYS: lease keys -> {key, value, expires_at ms, remaining ms, key, ...} for the keys
# that hold a live string.
_SNAPSHOT: Final = """
local out = {}
for _, key in ipairs(KEYS) do
    local held = redis.pcall('GET', key)
    if type(held) == 'string' then
        local left = redis.call('PTTL', key)
        if left > 0 then
            out[#out + 1] = key
            out[#out + 1] = held
            out[#out + 1] = redis.call('PEXPIRETIME', key)
            out[#out + 1] = left
        end
    end
end
return out
"""
# The server's clock in milliseconds, as every semaphore script reads it.
_NOW: Final = """
local clock = redis.call('TIME')
local now = tonumber(clock[1]) * 1000 + math.floor(tonumber(clock[2]) / 1000)
"""
# KEYS[1] semaphore hash, KEYS[2] fence counter; ARGV[1] limit, ARGV[2] owner,
# ARGV[3] ttl ms, ARGV[4] attempt -> {1, slot, token, expires_at ms} granted (also to a
# retry of this attempt), {0, slot, token, expires_at ms, remaining ms, owner} for the
# holder that ends first, {-1, limit found} when the holders have another limit.
_UNIT_ACQUIRE: Final = (
    _NOW
    + """
if tonumber(ARGV[3]) < 1 then
    return redis.error_reply('orbitive: a semaphore lease needs a ttl of at least 1 ms')
end
local limit = tonumber(ARGV[1])
local fields = redis.call('HGETALL', KEYS[1])
local live, count, found = {}, 0, nil
local first = nil
for at = 1, #fields, 2 do
    local field, value = fields[at], fields[at + 1]
    if field == 'limit' then
        found = tonumber(value)
    else
        local expires, token, attempt, owner = string.match(value, '^(%d+) (%d+) (%x+) (.*)$')
        if not expires then
            return redis.error_reply('orbitive: ' .. KEYS[1] .. ' does not hold a semaphore')
        end
        expires = tonumber(expires)
        if expires <= now then
            redis.call('HDEL', KEYS[1], field)
        elseif attempt == ARGV[4] then
            return {1, tonumber(field), tonumber(token), expires}
        else
            count = count + 1
            live[tonumber(field)] = true
            if first == nil or expires < first[3] then
                first = {tonumber(field), tonumber(token), expires, owner}
            end
        end
    end
end
if count > 0 and found ~= limit then
    return {-1, found or 0}
end
if count >= limit then
    return {0, first[1], first[2], first[3], first[3] - now, first[4]}
end
local slot = 0
while live[slot] do
    slot = slot + 1
end
local token = redis.call('INCR', KEYS[2])
local expires = now + tonumber(ARGV[3])
local value = string.format('%d %d %s %s', expires, token, ARGV[4], ARGV[2])
redis.call('HSET', KEYS[1], slot, value, 'limit', limit)
if redis.call('PEXPIRETIME', KEYS[1]) < expires then
    redis.call('PEXPIREAT', KEYS[1], expires)
end
return {1, slot, token, expires}
"""
)
# KEYS[1] semaphore hash; ARGV[1] ttl ms, then (slot, "TOKEN ATTEMPT OWNER") per grant
# -> the new expires_at ms per grant, 0 for a tenure that is gone.
_UNIT_RENEW: Final = (
    _NOW
    + """
if tonumber(ARGV[1]) < 1 then
    return redis.error_reply('orbitive: a semaphore lease needs a ttl of at least 1 ms')
end
local out, latest = {}, 0
for at = 2, #ARGV, 2 do
    local renewed = 0
    local value = redis.call('HGET', KEYS[1], ARGV[at])
    if value then
        local expires, rest = string.match(value, '^(%d+) (.*)$')
        if rest == ARGV[at + 1] and tonumber(expires) > now then
            renewed = now + tonumber(ARGV[1])
            redis.call('HSET', KEYS[1], ARGV[at], string.format('%d %s', renewed, rest))
            latest = renewed
        end
    end
    out[#out + 1] = renewed
end
if latest > 0 and redis.call('PEXPIRETIME', KEYS[1]) < latest then
    redis.call('PEXPIREAT', KEYS[1], latest)
end
return out
"""
)
# KEYS[1] semaphore hash, KEYS[2] receipt; ARGV[1] receipt ms, ARGV[2] channel,
# ARGV[3] name, then (slot, "TOKEN ATTEMPT OWNER") per grant -> "1 0 ..." (1: was live).
_UNIT_RELEASE: Final = (
    """
local done = redis.call('GET', KEYS[2])
if done then
    return done
end
"""
    + _NOW
    + """
local out, freed = {}, false
for at = 4, #ARGV, 2 do
    local released = '0'
    local value = redis.call('HGET', KEYS[1], ARGV[at])
    if value then
        local expires, rest = string.match(value, '^(%d+) (.*)$')
        if rest == ARGV[at + 1] then
            redis.call('HDEL', KEYS[1], ARGV[at])
            if tonumber(expires) > now then
                released = '1'
                freed = true
            end
        end
    end
    out[#out + 1] = released
end
if redis.call('HLEN', KEYS[1]) == 1 then
    redis.call('DEL', KEYS[1])
end
local answer = table.concat(out, ' ')
if freed then
    redis.call('SET', KEYS[2], answer, 'PX', ARGV[1])
    redis.call('PUBLISH', ARGV[2], ARGV[3])
end
return answer
"""
)
# KEYS: semaphore hashes -> {key, slot, limit, owner, token, expires_at ms, remaining ms,
# key, ...} for the live holders among them; keys that hold no hash are skipped.
_UNITS: Final = (
    _NOW
    + """
local out = {}
for _, key in ipairs(KEYS) do
    local fields = redis.pcall('HGETALL', key)
    if type(fields) == 'table' then
        local limit = 0
        for at = 1, #fields, 2 do
            if fields[at] == 'limit' then
                limit = tonumber(fields[at + 1])
            end
        end
        for at = 1, #fields, 2 do
            local value = fields[at + 1]
            local expires, token, _, owner = string.match(value, '^(%d+) (%d+) (%x+) (.*)$')
            if fields[at] ~= 'limit' and expires and tonumber(expires) > now then
                local row = {key, tonumber(fields[at]), limit, owner, tonumber(token),
                             tonumber(expires), tonumber(expires) - now}
                for _, item in ipairs(row) do
                    out[#out + 1] = item
                end
            end
        end
    end
end
return out
"""
)
_GLOB: Final = str.maketrans({char: "\\" + char for char in "\\*?[]"})
#: A subscribed connection that heard nothing for this long is pinged, in seconds.
_LISTENER_PROBE_S: Final = 5.0


class RedisGrant(NamedTuple):
    """A Redis tenure: its token, expiry (server epoch seconds) and the stored value."""

    fencing_token: int
    expires_at: float
    value: str


def _redis() -> ModuleType:
    try:
        import redis  # noqa: PLC0415 - optional dependency, loaded on first use
        import redis.backoff  # noqa: PLC0415 - with it: the NoBackoff the engine uses
        import redis.retry  # noqa: PLC0415 - with it: the Retry the engine uses
    except ImportError as error:
        raise StoreError(
            "the Redis store needs redis-py: pip install 'orbitive[redis]'",
            kind=ErrorKind.UNAVAILABLE,
        ) from error
    return redis


def _tenures(grants: Sequence[RedisUnit]) -> list[object]:
    """The script arguments naming ``grants``: slot and stored value, grant by grant."""
    return [part for grant in grants for part in (grant.slot, grant.value)]


def _ms(seconds: float) -> int:
    """Whole milliseconds, rounded down: a lease never outlasts its ttl."""
    return math.floor(seconds * 1000.0)


class _Script(NamedTuple):
    """A Lua script and its SHA1, as EVALSHA names it."""

    source: str
    sha: str


def _script(source: str) -> _Script:
    return _Script(source, hashlib.sha1(source.encode(), usedforsecurity=False).hexdigest())


_SCRIPTS: Final = tuple(
    map(
        _script,
        (
            _ACQUIRE,
            _RENEW,
            _RELEASE,
            _FORCE,
            _SNAPSHOT,
            _UNIT_ACQUIRE,
            _UNIT_RENEW,
            _UNIT_RELEASE,
            _UNITS,
        ),
    )
)
_ACQUIRE_SCRIPT, _RENEW_SCRIPT, _RELEASE_SCRIPT, _FORCE_SCRIPT, _SNAPSHOT_SCRIPT = _SCRIPTS[:5]
_UNIT_ACQUIRE_SCRIPT, _UNIT_RENEW_SCRIPT, _UNIT_RELEASE_SCRIPT, _UNITS_SCRIPT = _SCRIPTS[5:]


class RedisUnit(NamedTuple):
    """A Redis tenure of a semaphore slot: slot, token, expiry (server epoch s), the value
    ``"TOKEN ATTEMPT OWNER"`` its field holds after the expiry."""

    slot: int
    fencing_token: int
    expires_at: float
    value: str


class RedisEngine(Engine[RedisGrant, RedisUnit]):
    """Named locks and semaphores as keys of one Redis node, timed by the server's clock.

    It is also the :class:`~._notifications.Channel` of its own notifications: a
    second connection, used only by their thread, subscribed to the semaphores'
    channel.
    """

    kind = "redis"

    def __init__(self, url: str, *, timeout: float, prefix: str = PREFIX_DEFAULT) -> None:
        module = _redis()
        self._errors = module.RedisError
        self._transient = (module.ConnectionError, module.TimeoutError)
        self._no_script = module.exceptions.NoScriptError
        self._timeout = timeout
        self._receipt_ms = str(_ms(max(RECEIPT_MIN_S, 3.0 * timeout)))
        step_s = timeout / 4.0  # connect + command, twice
        try:
            self._pool: ConnectionPool = module.ConnectionPool.from_url(
                url,
                decode_responses=True,
                socket_timeout=step_s,
                socket_connect_timeout=step_s,
                retry=module.retry.Retry(module.backoff.NoBackoff(), 0),
                retry_on_timeout=False,
            )
            # a redis-py Connection (its methods are untyped), built from the URL's arguments
            self._conn: Any = self._pool.make_connection()
        except (ValueError, TypeError, self._errors) as error:  # redis-py's verdict on the URL
            raise InvalidStoreUrl(f"redis store URL refused: {error}") from None
        self._reachability = Reachability("redis store")
        self._mutex = threading.Lock()
        self._closed = False
        self._prefix = prefix
        self._lease_prefix = f"{prefix}lock:"
        self._unit_prefix = f"{prefix}sem:"
        self._channel = f"{prefix}semaphores"
        self._fence = f"{prefix}fence"
        self._subscriber: Any = None  # the listening Connection, made once per process
        self._heard = 0.0  # time.monotonic() the subscriber last heard from the server
        self._pinged = 0.0  # time.monotonic() of an unanswered PING, or 0
        self._notifications = Notifications(self)
        try:
            self._check_version()
            for script in _SCRIPTS:
                self._run("SCRIPT", "LOAD", script.source)  # a call's first EVALSHA runs it
        except BaseException:
            self._drop()  # a half-opened engine leaves no connection behind
            raise
        _fork.register(self)

    def _check_version(self) -> None:
        """Refuse a server older than :data:`SERVER_MIN` (the scripts need PEXPIRETIME)."""
        info = str(self._run("INFO", "server"))
        found = re.search(r"^redis_version:(\d+)\.(\d+)", info, re.MULTILINE)
        if found is None or (int(found[1]), int(found[2])) < SERVER_MIN:
            version = "unknown" if found is None else f"{found[1]}.{found[2]}"
            raise StoreError(
                f"the redis store needs Redis {SERVER_MIN[0]}.{SERVER_MIN[1]} or later; "
                f"the server reports {version}",
                kind=ErrorKind.DATABASE,
            )

    # -- the primitives ---------------------------------------------------------------------

    def acquire(self, name: str, owner: str, ttl: float) -> RedisGrant | Busy:
        attempt = attempt_id()
        keys = (self._lease_prefix + name, self._fence)
        granted, token, holder, expires_ms, left_ms = self._eval(
            _ACQUIRE_SCRIPT, keys, owner, _ms(ttl), attempt
        )
        if granted:
            return RedisGrant(token, expires_ms / 1000.0, f"{token} {attempt} {owner}")
        return Busy(LockInfo(name, holder, token, expires_ms / 1000.0, left_ms / 1000.0))

    def renew(self, name: str, owner: str, grant: RedisGrant, ttl: float) -> RedisGrant | None:
        keys = (self._lease_prefix + name,)
        expires_ms = self._eval(_RENEW_SCRIPT, keys, grant.value, _ms(ttl))
        return None if expires_ms is None else grant._replace(expires_at=expires_ms / 1000.0)

    def release(self, name: str, owner: str, grant: RedisGrant) -> bool:
        keys = (self._lease_prefix + name, self._receipt())
        return bool(self._eval(_RELEASE_SCRIPT, keys, grant.value, self._receipt_ms))

    def force_release(self, name: str) -> bool:
        keys = (self._lease_prefix + name, self._receipt())
        return bool(self._eval(_FORCE_SCRIPT, keys, self._receipt_ms))

    def inspect(self, name: str) -> LockInfo | None:
        found = self._infos((self._lease_prefix + name,))
        return found[0] if found else None

    def locks(self) -> list[LockInfo]:
        pattern = self._lease_prefix.translate(_GLOB) + "*"
        # SCAN may return a key twice: one snapshot per name.
        infos = {info.name: info for batch in self._scan(pattern) for info in self._infos(batch)}
        return sorted(infos.values(), key=lambda info: info.name.encode())

    def acquire_unit(self, name: str, limit: int, owner: str, ttl: float) -> RedisUnit | Busy:
        attempt = attempt_id()
        keys = (self._unit_prefix + name, self._fence)
        reply = self._eval(_UNIT_ACQUIRE_SCRIPT, keys, limit, owner, _ms(ttl), attempt)
        if reply[0] == 1:
            _, slot, token, expires_ms = reply
            return RedisUnit(slot, token, expires_ms / 1000.0, f"{token} {attempt} {owner}")
        if reply[0] == -1:
            raise limit_mismatch(name, limit, reply[1])
        _, slot, token, expires_ms, left_ms, holder = reply
        return Busy(
            SlotInfo(name, slot, limit, holder, token, expires_ms / 1000.0, left_ms / 1000.0)
        )

    def renew_units(
        self, name: str, owner: str, grants: Sequence[RedisUnit], ttl: float
    ) -> list[RedisUnit | None]:
        keys = (self._unit_prefix + name,)
        reply = self._eval(_UNIT_RENEW_SCRIPT, keys, _ms(ttl), *_tenures(grants))
        return [
            grant._replace(expires_at=expires_ms / 1000.0) if expires_ms else None
            for grant, expires_ms in zip(grants, reply, strict=True)
        ]

    def release_units(self, name: str, owner: str, grants: Sequence[RedisUnit]) -> list[bool]:
        keys = (self._unit_prefix + name, self._receipt())
        args = (self._receipt_ms, self._channel, name, *_tenures(grants))
        reply = self._eval(_UNIT_RELEASE_SCRIPT, keys, *args)
        return [flag == "1" for flag in str(reply).split()]

    def holders(self, name: str) -> list[SlotInfo]:
        return self._units((self._unit_prefix + name,))

    def semaphores(self) -> list[SlotInfo]:
        pattern = self._unit_prefix.translate(_GLOB) + "*"
        # SCAN may return a key twice: one snapshot per name and slot.
        found = {
            (info.name, info.slot): info
            for batch in self._scan(pattern)
            for info in self._units(batch)
        }
        return sorted(found.values(), key=lambda info: (info.name.encode(), info.slot))

    def subscribe(self, name: str) -> Subscription:
        return self._notifications.subscribe(name)

    # -- the subscribed connection (the Channel of the notifications' thread) -----------------

    def listen(self) -> None:
        """Subscribe a second connection to the semaphores' channel."""
        if self._closed:
            raise StoreError("redis store is closed", kind=ErrorKind.CLOSED)
        if self._subscriber is None:  # one per process, as the engine's own (see the docstring)
            self._subscriber = self._pool.make_connection()
        self._subscriber.send_command("SUBSCRIBE", self._channel)
        self._subscriber.read_response(push_request=True)
        self._heard, self._pinged = time.monotonic(), 0.0

    def receive(self, timeout: float) -> list[str]:
        """Names published within ``timeout`` seconds. A connection silent for a while is
        pinged; one that leaves the ping unanswered for a call timeout counts as broken.

        Raises:
            redis.TimeoutError: the ping went unanswered. redis.ConnectionError: broken.
        """
        conn = self._subscriber
        names: list[str] = []
        heard = ready = conn.can_read(timeout=timeout)
        while ready:
            message = conn.read_response(push_request=True)
            if message[0] == "message":
                names.append(message[2])
            ready = conn.can_read(timeout=0)
        now = time.monotonic()
        if heard:
            self._heard, self._pinged = now, 0.0
        elif self._pinged and now - self._pinged > self._timeout:
            raise self._transient[1]("no reply to PING on the subscribed connection")
        elif not self._pinged and now - self._heard > _LISTENER_PROBE_S:
            conn.send_command("PING")
            self._pinged = now
        return names

    def hang_up(self) -> None:
        """Close the subscribed connection's socket; the same ``Connection`` listens again."""
        if self._subscriber is not None:
            self._subscriber.disconnect()

    # -- reading leases -----------------------------------------------------------------------

    def _scan(self, pattern: str) -> Iterator[tuple[str, ...]]:
        """Batches of keys matching ``pattern``, one SCAN step each."""
        cursor = "0"
        while True:
            cursor, keys = self._run("SCAN", cursor, "MATCH", pattern, "COUNT", _SCAN_COUNT)
            if keys:
                yield tuple(keys)
            if cursor == "0":
                return

    def _infos(self, keys: tuple[str, ...]) -> list[LockInfo]:
        """Snapshots of the live leases among ``keys``; values not in lease form are skipped."""
        reply = self._eval(_SNAPSHOT_SCRIPT, keys)
        infos = []
        for at in range(0, len(reply), 4):
            key, value, expires_ms, left_ms = reply[at : at + 4]
            parts = value.split(" ", 2)
            if len(parts) != 3 or not parts[0].isdigit():
                continue
            token, _, owner = parts
            name = key[len(self._lease_prefix) :]
            infos.append(LockInfo(name, owner, int(token), expires_ms / 1000.0, left_ms / 1000.0))
        return infos

    def _units(self, keys: tuple[str, ...]) -> list[SlotInfo]:
        """Snapshots of the live semaphore holders among the hashes ``keys``, by slot."""
        reply = self._eval(_UNITS_SCRIPT, keys)
        cut = len(self._unit_prefix)
        infos = []
        for at in range(0, len(reply), 7):
            key, slot, limit, owner, token, expires_ms, left_ms = reply[at : at + 7]
            infos.append(
                SlotInfo(
                    key[cut:], slot, limit, owner, token, expires_ms / 1000.0, left_ms / 1000.0
                )
            )
        return sorted(infos, key=lambda info: info.slot)

    # -- the connection, retries, errors ------------------------------------------------------

    def _receipt(self) -> str:
        return f"{self._prefix}receipt:{attempt_id()}"

    def _eval(self, script: _Script, keys: tuple[str, ...], *args: object) -> Any:
        """Run ``script`` (its attempt id, if any, is already among ``args``)."""
        return self._run("EVALSHA", script.sha, len(keys), *keys, *args, script=script)

    def _run(self, *command: object, script: _Script | None = None) -> Any:
        """Send ``command`` and read its reply within the call timeout.

        A connection error drops the connection; the command is sent once more on
        a new one while time is left. Every command is safe to repeat: the scripts
        recognise their own attempt. NOSCRIPT loads ``script`` and sends it again.
        """
        with self._reachability:
            deadline = Deadline(self._timeout)
            if not self._mutex.acquire(timeout=max(deadline.left(), 0.0)):
                raise timed_out(self.kind, deadline)
            try:
                failure: BaseException | None = None
                for _ in deadline.attempts():
                    try:
                        return self._exchange(command, script)
                    except self._transient as error:
                        self._disconnect()
                        failure = error
                    except self._errors as error:
                        raise StoreError(
                            f"redis store: {error}", kind=ErrorKind.DATABASE
                        ) from error
                assert failure is not None  # the loop either returned or failed at least once
                raise gave_up(self.kind, deadline, failure) from failure
            finally:
                self._mutex.release()

    def _exchange(self, command: tuple[object, ...], script: _Script | None) -> Any:
        conn = self._connection()
        try:
            conn.send_command(*command)
            return conn.read_response()
        except self._no_script:
            if script is None:
                raise
            conn.send_command("SCRIPT", "LOAD", script.source)
            conn.read_response()
            conn.send_command(*command)
            return conn.read_response()

    def _connection(self) -> Any:
        if self._closed:
            raise StoreError("redis store is closed", kind=ErrorKind.CLOSED)
        if self._conn is None:
            self._conn = self._pool.make_connection()  # once per process: see the docstring
        return self._conn

    def _disconnect(self) -> None:
        """Close the socket; the same ``Connection`` connects afresh on its next command."""
        if self._conn is not None:
            self._conn.disconnect()

    def _drop(self) -> None:
        self._disconnect()
        self._conn = None

    def _after_fork_in_child(self) -> None:
        self._mutex = threading.Lock()
        self._drop()  # in a child, redis-py closes the socket without shutdown
        subscriber, self._subscriber = self._subscriber, None
        if subscriber is not None:
            subscriber.disconnect()
        self._pool.reset()  # the child's pool counts only the connections it makes

    def close(self) -> None:
        self._notifications.close()
        with self._mutex:
            self._closed = True
            self._drop()
            self._pool.disconnect()

    def __repr__(self) -> str:
        return "<RedisEngine>"
