"""The rounding log of one interval: byte format, limits, commitment (SPEC VI §3-§4).

A log lists the rounding decisions a worker took where its float64 value lay within τ of a
float32 rounding boundary. Its bytes are::

    "DKRL" || u8(version=1) || u8(precision=1) || u8(tau_log2) || u8(0)
      || job_id (32) || u64(interval) || u64(sites) || trace (32) || u64(count)
      || groups, one per site with entries, each
         varint(site_delta) || varint(n - 1) || n times varint(2 * element_field + direction)

Entries (``count`` in all) are strictly increasing in ``(site, element)``; ``site_delta`` is the
group's site minus the previous group's (the first group: the site itself); the first entry of
a group carries its element index, later ones the (positive) difference to the previous
element. Varints are
minimal unsigned LEB128. Each interval's log is committed by its digest
``tagged_hash("dk/v1/rounding/log", blob)`` in the interval's ``ext.rounding_log`` (SPEC VI §4),
which enters the interval's transcript leaf.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field

from dk.crypto.hashing import tagged_hash
from dk.errors import FormatError

# SPEC VI §2: the tags of Part VI (Part I's table lists Part I's only).
TAG_LOG = "dk/v1/rounding/log"
TAG_TRACE = "dk/v1/rounding/trace"

MAGIC = b"DKRL"
VERSION = 1
PRECISION_F32_FROM_F64 = 1
HEADER_SIZE = 96
MIN_TAU_LOG2 = 6
MAX_TAU_LOG2 = 24
# The job's default k (``pol.rounding_tau_log2``, SPEC VI §2): sound across machines for the
# float64 differences SPEC VI Notes measure across CPU capability, MKL path and threads (2^-12.0).
DEFAULT_TAU_LOG2 = 10
MAX_ENTRIES = 1 << 24
MAX_LOG_BYTES = 64 * 1024 * 1024
MAX_SITES = 1 << 40
MAX_ELEMENT = 1 << 48
EMPTY_TRACE = bytes(32)

# SPEC VI §5: reason codes of Part VI (verifier report codes).
LOG_MALFORMED = "ROUNDING_LOG_MALFORMED"
LOG_MISMATCH = "ROUNDING_LOG_MISMATCH"
LOG_INVALID = "ROUNDING_LOG_INVALID"
LOG_MISSING = "ROUNDING_LOG_MISSING"
TRACE_MISMATCH = "ROUNDING_TRACE_MISMATCH"


@dataclass
class RoundingLog:
    """The decoded log of one interval (SPEC VI §3).

    Attributes:
        job_id: the job the log belongs to (32 bytes).
        interval: the interval index it belongs to.
        tau_log2: ``k`` with ``τ = 2**-k`` (fraction of the float32 gap).
        sites: rounding sites the worker's run executed in the interval.
        trace: the trace digest over those sites (SPEC VI §2).
        entries: ``(site, element, direction)`` triples, strictly increasing; direction 1
            rounds up (toward +inf), 0 down.
    """

    job_id: bytes
    interval: int
    tau_log2: int
    sites: int = 0
    trace: bytes = EMPTY_TRACE
    entries: list[tuple[int, int, int]] = field(default_factory=list)

    def encode(self) -> bytes:
        """The canonical bytes of the log (SPEC VI §3)."""
        _check_header(self.job_id, self.interval, self.tau_log2, self.sites, self.trace)
        if len(self.entries) > MAX_ENTRIES:
            raise FormatError(f"rounding log: {len(self.entries)} entries > {MAX_ENTRIES}")
        out = bytearray(
            MAGIC
            + bytes([VERSION, PRECISION_F32_FROM_F64, self.tau_log2, 0])
            + self.job_id
            + struct.pack("<QQ", self.interval, self.sites)
            + self.trace
            + struct.pack("<Q", len(self.entries))
        )
        prev_site, prev_elem = -1, -1
        groups: list[tuple[int, list[int]]] = []  # (site, fields) per run of one site
        for site, elem, direction in self.entries:
            if not (0 <= site < self.sites and 0 <= elem < MAX_ELEMENT and direction in (0, 1)):
                raise FormatError(f"rounding log: bad entry {(site, elem, direction)}")
            if (site, elem) <= (prev_site, prev_elem):
                raise FormatError("rounding log: entries not strictly increasing")
            if site != prev_site:
                groups.append((site, [2 * elem + direction]))
            else:
                groups[-1][1].append(2 * (elem - prev_elem) + direction)
            prev_site, prev_elem = site, elem
        prev_site = 0
        for site, fields in groups:
            out += _varint(site - prev_site) + _varint(len(fields) - 1)
            out += b"".join(_varint(f) for f in fields)
            prev_site = site
        if len(out) > MAX_LOG_BYTES:
            raise FormatError(f"rounding log: {len(out)} bytes > {MAX_LOG_BYTES}")
        return bytes(out)


def _check_header(job_id: bytes, interval: int, tau_log2: int, sites: int, trace: bytes) -> None:
    if len(job_id) != 32 or len(trace) != 32:
        raise FormatError("rounding log: job_id and trace are 32 bytes", reason=LOG_MALFORMED)
    if not MIN_TAU_LOG2 <= tau_log2 <= MAX_TAU_LOG2:
        raise FormatError(
            f"rounding log: tau_log2 {tau_log2} outside [{MIN_TAU_LOG2}, {MAX_TAU_LOG2}]",
            reason=LOG_MALFORMED,
        )
    if not 0 <= interval < 1 << 63 or not 0 <= sites <= MAX_SITES:
        raise FormatError("rounding log: interval or site count out of range", reason=LOG_MALFORMED)


def _varint(n: int) -> bytes:
    out = bytearray()
    while n >= 0x80:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def _read_varint(data: bytes, pos: int) -> tuple[int, int]:
    n, shift = 0, 0
    for i in range(10):
        if pos + i >= len(data):
            raise FormatError("rounding log: truncated varint", reason=LOG_MALFORMED)
        b = data[pos + i]
        n |= (b & 0x7F) << shift
        if not b & 0x80:
            if i > 0 and b == 0:
                raise FormatError("rounding log: non-minimal varint", reason=LOG_MALFORMED)
            if n >= 1 << 64:
                raise FormatError("rounding log: varint over 64 bits", reason=LOG_MALFORMED)
            return n, pos + i + 1
        shift += 7
    raise FormatError("rounding log: varint longer than 10 bytes", reason=LOG_MALFORMED)


def decode_log(data: bytes) -> RoundingLog:
    """Parse a log blob strictly (SPEC VI §3); raises ``FormatError`` (ROUNDING_LOG_MALFORMED).

    >>> log = RoundingLog(bytes(32), 3, 12, sites=5, entries=[(1, 7, 1), (1, 9, 0), (4, 0, 1)])
    >>> decode_log(log.encode()) == log
    True
    """
    if len(data) > MAX_LOG_BYTES:
        raise FormatError(f"rounding log: more than {MAX_LOG_BYTES} bytes", reason=LOG_MALFORMED)
    if len(data) < HEADER_SIZE or data[:4] != MAGIC:
        raise FormatError("rounding log: bad magic or short header", reason=LOG_MALFORMED)
    version, precision, tau_log2, reserved = data[4:8]
    if version != VERSION or precision != PRECISION_F32_FROM_F64 or reserved != 0:
        raise FormatError("rounding log: unknown version or precision", reason=LOG_MALFORMED)
    job_id = data[8:40]
    interval, sites = struct.unpack_from("<QQ", data, 40)
    trace = data[56:88]
    (count,) = struct.unpack_from("<Q", data, 88)
    _check_header(job_id, interval, tau_log2, sites, trace)
    if count > MAX_ENTRIES or count > len(data) - HEADER_SIZE:
        raise FormatError("rounding log: entry count exceeds limit or data", reason=LOG_MALFORMED)
    entries: list[tuple[int, int, int]] = []
    pos, site = HEADER_SIZE, 0
    while len(entries) < count:  # groups: varint(site_delta) varint(n - 1) n fields
        delta, pos = _read_varint(data, pos)
        if delta == 0 and entries:
            raise FormatError("rounding log: repeated site group", reason=LOG_MALFORMED)
        n, pos = _read_varint(data, pos)
        site += delta
        if site >= sites or n >= count - len(entries):
            raise FormatError("rounding log: site or group size out of range", reason=LOG_MALFORMED)
        elem = -1
        for j in range(n + 1):
            field_, pos = _read_varint(data, pos)
            step, direction = field_ >> 1, field_ & 1
            if j > 0 and step == 0:
                raise FormatError("rounding log: repeated element", reason=LOG_MALFORMED)
            elem = step if j == 0 else elem + step
            if elem >= MAX_ELEMENT:
                raise FormatError("rounding log: element out of range", reason=LOG_MALFORMED)
            entries.append((site, elem, direction))
    if pos != len(data):
        raise FormatError("rounding log: trailing bytes", reason=LOG_MALFORMED)
    return RoundingLog(bytes(job_id), interval, tau_log2, sites, bytes(trace), entries)


def log_digest(blob: bytes) -> bytes:
    """The commitment to one interval's log blob (SPEC VI §4)."""
    return tagged_hash(TAG_LOG, blob)


def check_binding(log: RoundingLog, *, job_id: bytes, interval: int, tau_log2: int) -> None:
    """Require the log to belong to this job, interval and τ (SPEC VI §5, ROUNDING_LOG_MISMATCH)."""
    if log.job_id != job_id or log.interval != interval or log.tau_log2 != tau_log2:
        raise FormatError(
            f"rounding log belongs to job {log.job_id.hex()[:12]}…, interval {log.interval}, "
            f"tau 2^-{log.tau_log2}; expected interval {interval}, tau 2^-{tau_log2} (the job's)",
            reason=LOG_MISMATCH,
        )
