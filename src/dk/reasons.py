"""Every reason code dk emits, in one vocabulary: its outcome and its meaning (SPEC §14.1).

This module is the single source of reason codes. Verification reports (SPEC §14.1), zk proof
checks (Part IV §6-§9), the gradient wire format (Part III §4.3), rounding logs (Part VI §5),
federated rounds (Part VII §6), the market (Part V §7-§9) and the vector checker all name their
codes here; the enums the layers use (:class:`Reason`, :class:`ZkReason`, :class:`WireReason`)
are defined here too. Code strings are stable API: never renamed or reused.

Each code has one outcome:

* ``reject`` — in a verification report, the worker's evidence is wrong (the only outcome that
  slashes);
* ``inconclusive`` — in a verification report, the verifier's side fell short (its inputs,
  data, backend, SRS or machine): nothing moves, another validator is asked;
* ``refused`` — not a verification verdict: a request, message or operation is refused (the
  market, the market server, a wire or codec parser, the vector checker). When such an error
  meets the verifier, the verifier reports its own code for the check that ran (SPEC §12.2).

Importable from every layer: it imports nothing from dk.
"""

# ruff: noqa: E501  (the vocabulary is a table: one code per line)

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum, StrEnum
from types import MappingProxyType

REJECT, INCONCLUSIVE, REFUSED = "reject", "inconclusive", "refused"
OUTCOMES = (REJECT, INCONCLUSIVE, REFUSED)


@dataclass(frozen=True)
class Code:
    """One reason code: its string, outcome, one-line meaning and the SPEC place that lists it."""

    name: str
    outcome: str
    meaning: str
    spec: str


_R, _I, _F = REJECT, INCONCLUSIVE, REFUSED

_CODES: tuple[tuple[str, str, str, str], ...] = (
    # -- verification reports (SPEC §12.2, §14.1) ----------------------------------------------
    ("BUNDLE_NOT_FOUND", _I, "the bundle directory the verifier was given does not exist", "I §14.1"),
    ("JOB_MALFORMED", _I, "the verifier's job file does not parse, or does not fit its data", "I §14.1"),
    ("MANIFEST_MISSING", _R, "the bundle has no manifest.json", "I §12.2"),
    ("MANIFEST_TOO_LARGE", _R, "manifest.json is over its size limit", "I §12.2"),
    ("MANIFEST_MALFORMED", _R, "manifest.json does not parse strictly or is not canonical", "I §12.2"),
    ("UNSUPPORTED_VERSION", _R, "the manifest's format version is not one this verifier knows", "I §12.2"),
    ("SIGNATURE_MISSING", _R, "the bundle has no signature.hex", "I §12.2"),
    ("SIGNATURE_INVALID", _R, "the worker's Ed25519 signature is malformed or does not verify", "I §12.2"),
    ("TRANSCRIPT_ROOT_MISMATCH", _R, "the transcript root is not the root of the manifest's entries", "I §12.2"),
    ("TRANSCRIPT_MALFORMED", _R, "checkpoint steps or interval ranges are not the job's", "I §12.2"),
    ("JOB_MISMATCH", _R, "the bundle (or a market submission) is for another job", "I §12.2"),
    ("WORKER_MISMATCH", _R, "the bundle is signed by another worker than the one required", "I §12.2"),
    ("DATA_MISMATCH", _R, "the bundle's data root is not the job's pinned data root", "I §12.2"),
    ("INIT_MISMATCH", _R, "checkpoint 0 is not the job's initial weights", "I §12.2"),
    ("BAD_PATH", _R, "a blob path is not blobs/<root>.safetensors or escapes the bundle", "I §12.2"),
    ("BLOB_MISSING", _R, "a checkpoint blob the verifier fetches is absent", "I §12.2"),
    ("BLOB_TOO_LARGE", _R, "a checkpoint blob is over its size limit", "I §12.2"),
    ("BLOB_MALFORMED", _R, "a checkpoint blob is not strict safetensors of the manifest's size", "I §12.2"),
    ("COMMITMENT_MISMATCH", _R, "a checkpoint does not hash to its committed root", "I §12.2"),
    ("SHAPE_MISMATCH", _R, "a checkpoint's tensor names, dtypes or shapes are not the job's", "I §12.2"),
    ("TENSOR_INVALID", _R, "a checkpoint holds NaN or infinite values", "I §12.2"),
    ("STEP_MISMATCH", _R, "a checkpoint holds the step or sampler state of another step", "I §12.2"),
    ("HPARAM_MISMATCH", _R, "a checkpoint's hyperparameters are not the job's", "I §12.2"),
    ("BATCH_MISMATCH", _R, "an interval's batch commitment is not the job's sampler order", "I §12.2"),
    ("METADATA_MISMATCH", _R, "an interval's claimed update norm is not its checkpoints'", "I §12.2"),
    ("REPLAY_MISMATCH", _R, "a challenged interval does not replay to its committed end", "I §12.2"),
    ("ROOT_NOT_CHALLENGED", _R, "the bundle's root is not the root the challenge pinned", "I §12.1"),
    ("LOSS_MISSING", _R, "an interval of a loss-committing job carries no ext.loss", "I §11.7"),
    ("LOSS_MISMATCH", _R, "a challenged interval's committed loss is not its replayed loss", "I §11.7"),
    ("RANK_SIGNATURE_INVALID", _R, "a data-parallel rank's signature over the root is bad or missing", "I §12.6"),
    ("RANK_DIGEST_MISMATCH", _R, "a rank's step messages are not its committed interval digest", "I §12.6"),
    ("DATA_UNAVAILABLE", _I, "the verifier's copy of the data is missing or has another root", "I §14.1"),
    ("DECODER_MISMATCH", _I, "the verifier's image decoder is not the one the job names", "I §14.1"),
    ("MODE_UNSUPPORTED", _I, "this check does not apply to the job's mode (a zk interval)", "I §14.1"),
    ("EXECUTOR_FAILED", _I, "the replay executor (processes, Ray) failed past its retries", "I §12.5"),
    ("INIT_UNAVAILABLE", _I, "the verifier's init.safetensors is missing or not init.root", "I §14.1"),
    ("BACKEND_UNAVAILABLE", _I, "an optional backend the check needs is not installed here", "I §14.1"),
    ("INTERNAL_ERROR", _I, "an unforeseen failure in the verifier (a bug in dk)", "I §14.1"),
    # -- zk proofs (Part IV §6-§9) ------------------------------------------------------------
    ("ZK_PROOF_MISSING", _R, "a challenged step has no proof in the bundle", "IV §9.5"),
    ("ZK_MALFORMED", _R, "a proof record is malformed (fields, sizes, encodings)", "IV §6"),
    ("ZK_CIRCUIT_MISMATCH", _R, "a proof is for another circuit (model, loss, lr, batch, settings)", "IV §6"),
    ("ZK_SRS_MISMATCH", _R, "a proof was made with another SRS than the one pinned", "IV §6"),
    ("ZK_STEP_MISMATCH", _R, "a proof's statement is not the committed step", "IV §6"),
    ("ZK_INSTANCE_MISMATCH", _R, "public instances do not encode the claimed statement", "IV §6"),
    ("ZK_OUTPUT_BOUND", _R, "public outputs lie beyond the bound from the float step", "IV §6"),
    ("ZK_PROOF_INVALID", _R, "the SNARK does not verify against the verifier's own key", "IV §6"),
    ("ZK_CHAIN_BROKEN", _R, "consecutive step proofs do not link, or their count is wrong", "IV §6"),
    ("ZK_SRS_UNAVAILABLE", _I, "the verifier does not hold the SRS the job accepts", "IV §5"),
    ("ZK_INSECURE_SRS", _F, "flag, not a fault: proven with a locally generated SRS", "IV §6"),
    ("ZK_CIRCUIT_REJECTED", _F, "a circuit could not be built or miscomputes (prover side)", "IV §4"),
    # -- rounding logs (Part VI §5) -----------------------------------------------------------
    ("ROUNDING_LOG_MALFORMED", _R, "a rounding log blob breaks its size or strict parse", "VI §5"),
    ("ROUNDING_LOG_MISMATCH", _R, "a rounding log is not bound to the job, interval and tau", "VI §5"),
    ("ROUNDING_LOG_INVALID", _R, "a logged direction is not near the verifier's boundary", "VI §5"),
    ("ROUNDING_LOG_MISSING", _R, "a rounding site near a boundary has no log entry", "VI §5"),
    ("ROUNDING_TRACE_MISMATCH", _R, "the replay's site count or trace differs (inconclusive on another torch)", "VI §5"),
    # -- federated rounds (Part VII §6) -------------------------------------------------------
    ("BUNDLE_MISSING", _R, "a client's update carries no bundle or data root", "VII §6"),
    ("BUNDLE_MALFORMED", _R, "a client's packed bundle breaks its format or limits", "VII §6"),
    ("UPDATE_MALFORMED", _R, "a client's update cannot be read", "VII §6"),
    ("UPDATE_MISMATCH", _R, "a client's update is not its bundle's final weights", "VII §6"),
    ("ADMISSION_INVALID", _R, "a secure-round admission lacks keys or its verifier's signature", "VII §6"),
    ("MASKED_INPUT_MISMATCH", _R, "a masked input is not the one its verifier signed", "VII §6"),
    # -- gradient compression: codec specs, state and the wire (Part III §2, §4.3, §5) ---------
    ("BAD_CODEC_SPEC", _F, "a codec spec string names unknown keys or out-of-range values", "III §2"),
    ("BAD_CODEC_STATE", _F, "a checkpoint's codec state is malformed", "III §5"),
    ("TRUNCATED", _F, "a wire message is shorter than its header", "III §4.3"),
    ("BAD_MAGIC", _F, "a wire message does not start with the magic bytes", "III §4.3"),
    ("BAD_VERSION", _F, "a wire message has an unknown version", "III §4.3"),
    ("UNKNOWN_CODEC", _F, "a wire message names an unknown codec", "III §4.3"),
    ("BAD_DTYPE", _F, "a wire message names an unsupported dtype", "III §4.3"),
    ("NDIM_LIMIT", _F, "a wire message has more than 8 dimensions", "III §4.3"),
    ("ELEMENT_LIMIT", _F, "a wire message's element count is over its limit", "III §4.3"),
    ("PAYLOAD_LIMIT", _F, "a wire message's payload length is over its limit", "III §4.3"),
    ("LENGTH_MISMATCH", _F, "a wire message's length is not header plus payload", "III §4.3"),
    ("PAYLOAD_LENGTH", _F, "a wire payload is not consumed exactly", "III §4.3"),
    ("BAD_BLOCK", _F, "a wire payload's block size is out of range", "III §4.3"),
    ("BAD_LEVELS", _F, "a QSGD payload's level count is out of range", "III §4.3"),
    ("K_RANGE", _F, "a top-k payload's k is out of range", "III §4.3"),
    ("INDEX_ORDER", _F, "top-k indices are not strictly increasing", "III §4.3"),
    ("INDEX_RANGE", _F, "a top-k index is outside the tensor", "III §4.3"),
    ("NON_FINITE", _F, "a wire payload holds NaN or infinite values", "III §4.3"),
    ("BAD_SCALE", _F, "a block scale is negative or not the canonical one", "III §4.3"),
    ("CODE_RANGE", _F, "a quantised code is outside its range", "III §4.3"),
    ("NONCANONICAL", _F, "a wire message is not the canonical encoding of its tensor", "III §4.3"),
    # -- the market: signed requests (Part V §2, §7) ------------------------------------------
    ("MALFORMED_REQUEST", _F, "a request envelope or body breaks its format", "V §7"),
    ("BAD_SIGNATURE", _F, "a request's signature is malformed or does not verify", "V §7"),
    ("WRONG_MARKET", _F, "a request is signed for another market", "V §7"),
    ("UNKNOWN_ACTION", _F, "a request names an unknown action", "V §7"),
    ("BAD_PARAMS", _F, "a request's or setting's parameters break their rules", "V §7"),
    ("REPLAY", _F, "a request's (account, nonce) was already accepted", "V §7"),
    # -- the market: state refusals (Part V §7) -----------------------------------------------
    ("INSUFFICIENT_FUNDS", _F, "the account holds less than the operation moves", "V §7"),
    ("LIMIT", _F, "a bounded list or amount is over its limit", "V §7"),
    ("NOT_OWNER", _F, "the account does not own the order, bid or challenge", "V §7"),
    ("BAD_STATE", _F, "the order's state does not allow the operation", "V §7"),
    ("UNKNOWN_ORDER", _F, "no such order", "V §7"),
    ("UNKNOWN_BID", _F, "no such bid", "V §7"),
    ("UNKNOWN_CHALLENGE", _F, "no such challenge", "V §7"),
    ("DEADLINE_PASSED", _F, "the deadline of the operation has passed", "V §7"),
    ("NO_MATCH", _F, "no bid matches the order", "V §7"),
    ("NOT_ENOUGH_VALIDATORS", _F, "fewer eligible validators than the draw needs", "V §7"),
    ("ALREADY_REGISTERED", _F, "the account or validator is already registered", "V §7"),
    ("STAKE_TOO_SMALL", _F, "a validator's stake is below the minimum", "V §7"),
    ("STAKE_MOVED", _F, "audit: money left a validator stake other than by the rules", "V §8"),
    ("BAD_POP", _F, "a BLS proof of possession does not verify", "V §7"),
    ("NOT_VALIDATOR", _F, "the account is not an active validator", "V §7"),
    ("VALIDATOR_BUSY", _F, "the validator is drawn for an unsettled order", "V §7"),
    ("NOT_DRAWN", _F, "the validator is not drawn for this order", "V §7"),
    ("ALREADY_SHARED", _F, "the validator already gave its beacon share", "V §7"),
    ("BAD_SHARE", _F, "a beacon share does not verify", "V §7"),
    ("NO_BEACON", _F, "the order's beacon is not fixed yet", "V §7"),
    ("NOT_YET", _F, "the operation's time has not come", "V §7"),
    ("NO_WITHHOLDER", _F, "no drawn validator withheld its share", "V §7"),
    ("DIGEST_MISMATCH", _F, "an attestation signs another report digest", "V §7"),
    ("ALREADY_ATTESTED", _F, "the validator already attested", "V §7"),
    ("NOT_ENOUGH_ATTESTATIONS", _F, "fewer than k distinct attestations", "V §7"),
    ("BUNDLE_MISMATCH", _F, "a submission's bundle is not the committed one", "V §7"),
    ("WINDOW_CLOSED", _F, "the challenge window has closed", "V §7"),
    ("BOND_TOO_SMALL", _F, "a challenger's bond is below the minimum", "V §7"),
    ("SELF_CHALLENGE", _F, "a worker challenges its own result", "V §7"),
    ("NOT_SETTLEABLE", _F, "the order cannot be settled yet", "V §7"),
    ("ALREADY_SETTLED", _F, "the order is already settled", "V §7"),
    ("NOT_INITIALISED", _F, "the market ledger is not initialised", "V §7"),
    ("ALREADY_INITIALISED", _F, "the market ledger is already initialised", "V §7"),
    ("REPORT_REJECTED", _F, "the recorded verification rejected the result", "V §7"),
    ("REPORT_INCONCLUSIVE", _F, "the recorded verification was inconclusive", "V §7"),
    ("CLOCK_LOCKED", _F, "a clock was given where the market keeps its own time", "V §7"),
    ("NEED_INTERVALS", _F, "a dispute names no interval to replay", "V §7"),
    ("AUDIT_FAILED", _F, "dk market audit found problems in the event log", "V §8"),
    ("SEQ_GAP", _F, "audit: event sequence numbers are not consecutive", "V §8"),
    ("CHAIN_BROKEN", _F, "audit: an event does not link to its predecessor's hash", "V §8"),
    ("HASH_MISMATCH", _F, "audit: an event's hash is not the hash of its body", "V §8"),
    ("MALFORMED_EVENT", _F, "audit: an event body does not parse", "V §8"),
    ("DRAW_MISMATCH", _F, "audit: a validator draw is not the one the state gives", "V §8"),
    ("BEACON_MISMATCH", _F, "audit: a fixed beacon is not the hash of the shares", "V §8"),
    ("BAD_ATTESTATION", _F, "vectors: an attestation aggregate does not verify", "V §8"),
    # -- the market: profiles, whistles, fees, treasury (Part V §11-§13) ----------------------
    ("NOT_PROFILED", _F, "the order takes no tolerance profiles", "V §7"),
    ("SELF_PROFILE", _F, "the consumer may not profile its own order", "V §7"),
    ("ALREADY_PROFILED", _F, "this validator already profiled the order", "V §7"),
    ("NOT_ENOUGH_PROFILES", _F, "fewer profiles than the order asks for: no match yet", "V §7"),
    ("DEPOSIT_TOO_SMALL", _F, "a deposit below the market's minimum", "V §7"),
    ("NOT_CHALLENGED", _F, "the whistled interval is not in the attested challenge", "V §7"),
    ("UNKNOWN_WHISTLE", _F, "no such whistle", "V §7"),
    ("NOTHING_TO_WHISTLE", _F, "a re-check found no failing challenged interval", "V §7"),
    ("TOLERANCE_MISMATCH", _F, "audit: an order's tolerance is not the median of its profiles", "V §8"),
    ("FEE_MISMATCH", _F, "audit: a release does not pay price and fee as locked", "V §8"),
    ("PAYEE_MISMATCH", _F, "audit: an outcome pays escrow or stake to another party", "V §8"),
    ("CLOCK_MISMATCH", _F, "audit: a settlement dated before its deadline or window", "V §8"),
    ("WHISTLE_PAYOUT", _F, "audit: a whistle's payout or forfeit breaks the rule", "V §8"),
    ("TREASURY_MOVED", _F, "audit: the treasury moved outside its in/out rules", "V §8"),
    # -- the market: cluster orders (Part V §14) ----------------------------------------------
    ("BAD_BLAME", _F, "a report's blame is unreadable: recorded inconclusive", "V §14.5"),
    ("BAD_RANK_SIGNATURE", _F, "vectors: a rank's signature over the root does not verify", "V §14.4"),
    ("RANK_MISMATCH", _F, "audit: a match's rank slots break the cluster rules", "V §14.6"),
    ("SHARE_MISMATCH", _F, "audit: shares are not the batch split, or not paid", "V §14.6"),
    ("SLASH_MISMATCH", _F, "audit: a rank stake went to the wrong party", "V §14.6"),
    # -- the market server (Part V §9) --------------------------------------------------------
    ("MALFORMED", _F, "the server could not read the request body", "V §9"),
    ("TOO_LARGE", _F, "the request body is over the server's limit (413)", "V §9"),
    ("RATE_LIMITED", _F, "the account is over its request rate (429)", "V §9"),
    ("JOB_UNKNOWN", _F, "the server holds no such job (409)", "V §9"),
    ("BUNDLE_UNKNOWN", _F, "the server holds no such bundle (409)", "V §9"),
    ("BUNDLE_INCOMPLETE", _F, "an uploaded bundle lacks a file its manifest names", "V §9"),
    ("NOT_FOUND", _F, "no such route (404)", "V §9"),
    ("METHOD_NOT_ALLOWED", _F, "the route does not take that method (405)", "V §9"),
    ("HTTP_ERROR", _F, "the client got an HTTP error without a reason code", "V §9"),
    # -- the vector checker (vectors/) --------------------------------------------------------
    ("ROOT_MISMATCH", _F, "vectors: a recomputed root differs from the case's", "I §14.1"),
    ("CHALLENGE_MISMATCH", _F, "vectors: a challenge document is not the one derived", "I §14.1"),
    ("REPORT_MISMATCH", _F, "vectors: a report is not the one the case expects", "I §14.1"),
    ("PROOF_INVALID", _F, "vectors: a Merkle inclusion proof does not verify", "I §14.1"),
    ("ENCODING_MISMATCH", _F, "vectors: an encoding (tensor stream, field element) differs", "I §14.1"),
    ("PERMUTATION_MISMATCH", _F, "vectors: a specified permutation differs", "I §14.1"),
    ("SAMPLE_MISMATCH", _F, "vectors: a sample without replacement differs", "I §14.1"),
    ("SAMPLES_MISMATCH", _F, "vectors: the sample count s for a detection target differs", "I §14.1"),
    ("PROBABILITY_MISMATCH", _F, "vectors: a detection probability differs", "I §14.1"),
    ("SEED_MISMATCH", _F, "vectors: a per-step seed differs", "I §14.1"),
    ("LR_MISMATCH", _F, "vectors: a learning rate of the schedule differs", "I §14.1"),
    ("AUGMENT_MISMATCH", _F, "vectors: an augmented batch differs", "I §14.1"),
)  # fmt: skip

#: Every code dk emits, by its string (SPEC §14.1, "One vocabulary").
VOCABULARY: MappingProxyType[str, Code] = MappingProxyType(
    {name: Code(name, outcome, meaning, spec) for name, outcome, meaning, spec in _CODES}
)


class Reason(str, Enum):
    """Codes of a verification report (SPEC §14.1). Codes are stable API: never renamed or
    reused. Each belongs to one outcome: :data:`VERIFIER_SIDE` codes make a report
    ``inconclusive``, every other code makes it ``reject``."""

    BUNDLE_NOT_FOUND = "BUNDLE_NOT_FOUND"
    JOB_MALFORMED = "JOB_MALFORMED"
    MANIFEST_MISSING = "MANIFEST_MISSING"
    MANIFEST_TOO_LARGE = "MANIFEST_TOO_LARGE"
    MANIFEST_MALFORMED = "MANIFEST_MALFORMED"
    UNSUPPORTED_VERSION = "UNSUPPORTED_VERSION"
    SIGNATURE_MISSING = "SIGNATURE_MISSING"
    SIGNATURE_INVALID = "SIGNATURE_INVALID"
    TRANSCRIPT_ROOT_MISMATCH = "TRANSCRIPT_ROOT_MISMATCH"
    TRANSCRIPT_MALFORMED = "TRANSCRIPT_MALFORMED"
    JOB_MISMATCH = "JOB_MISMATCH"
    WORKER_MISMATCH = "WORKER_MISMATCH"
    DATA_MISMATCH = "DATA_MISMATCH"
    INIT_MISMATCH = "INIT_MISMATCH"
    BAD_PATH = "BAD_PATH"
    BLOB_MISSING = "BLOB_MISSING"
    BLOB_TOO_LARGE = "BLOB_TOO_LARGE"
    BLOB_MALFORMED = "BLOB_MALFORMED"
    COMMITMENT_MISMATCH = "COMMITMENT_MISMATCH"
    SHAPE_MISMATCH = "SHAPE_MISMATCH"
    TENSOR_INVALID = "TENSOR_INVALID"
    STEP_MISMATCH = "STEP_MISMATCH"
    HPARAM_MISMATCH = "HPARAM_MISMATCH"
    BATCH_MISMATCH = "BATCH_MISMATCH"
    METADATA_MISMATCH = "METADATA_MISMATCH"
    REPLAY_MISMATCH = "REPLAY_MISMATCH"
    ZK_PROOF_MISSING = "ZK_PROOF_MISSING"
    ZK_PROOF_INVALID = "ZK_PROOF_INVALID"
    ZK_INSTANCE_MISMATCH = "ZK_INSTANCE_MISMATCH"
    ZK_CIRCUIT_MISMATCH = "ZK_CIRCUIT_MISMATCH"
    ZK_STEP_MISMATCH = "ZK_STEP_MISMATCH"
    ZK_CHAIN_BROKEN = "ZK_CHAIN_BROKEN"
    ZK_MALFORMED = "ZK_MALFORMED"
    ZK_SRS_MISMATCH = "ZK_SRS_MISMATCH"
    ZK_OUTPUT_BOUND = "ZK_OUTPUT_BOUND"
    BACKEND_UNAVAILABLE = "BACKEND_UNAVAILABLE"
    INTERNAL_ERROR = "INTERNAL_ERROR"
    ROOT_NOT_CHALLENGED = "ROOT_NOT_CHALLENGED"
    DATA_UNAVAILABLE = "DATA_UNAVAILABLE"
    DECODER_MISMATCH = "DECODER_MISMATCH"
    ZK_SRS_UNAVAILABLE = "ZK_SRS_UNAVAILABLE"
    MODE_UNSUPPORTED = "MODE_UNSUPPORTED"
    EXECUTOR_FAILED = "EXECUTOR_FAILED"
    INIT_UNAVAILABLE = "INIT_UNAVAILABLE"
    LOSS_MISSING = "LOSS_MISSING"
    LOSS_MISMATCH = "LOSS_MISMATCH"
    RANK_SIGNATURE_INVALID = "RANK_SIGNATURE_INVALID"
    RANK_DIGEST_MISMATCH = "RANK_DIGEST_MISMATCH"
    ROUNDING_LOG_MALFORMED = "ROUNDING_LOG_MALFORMED"
    ROUNDING_LOG_MISMATCH = "ROUNDING_LOG_MISMATCH"
    ROUNDING_LOG_INVALID = "ROUNDING_LOG_INVALID"
    ROUNDING_LOG_MISSING = "ROUNDING_LOG_MISSING"
    ROUNDING_TRACE_MISMATCH = "ROUNDING_TRACE_MISMATCH"


#: Report codes that say the *verifier* could not decide (SPEC §14.1): a report with only
#: these is ``inconclusive``; it never slashes.
VERIFIER_SIDE: frozenset[Reason] = frozenset(
    r for r in Reason if VOCABULARY[r.value].outcome == INCONCLUSIVE
)


class ZkReason(StrEnum):
    """Why a zk proof (or a chain of them) was rejected, or a flag on an accepted one
    (SPEC IV §6); ``OK`` is no code but the value of an accepted check."""

    OK = "OK"
    ZK_MALFORMED = "ZK_MALFORMED"
    ZK_CIRCUIT_MISMATCH = "ZK_CIRCUIT_MISMATCH"
    ZK_SRS_MISMATCH = "ZK_SRS_MISMATCH"
    ZK_STEP_MISMATCH = "ZK_STEP_MISMATCH"
    ZK_INSTANCE_MISMATCH = "ZK_INSTANCE_MISMATCH"
    ZK_OUTPUT_BOUND = "ZK_OUTPUT_BOUND"
    ZK_PROOF_INVALID = "ZK_PROOF_INVALID"
    ZK_CHAIN_BROKEN = "ZK_CHAIN_BROKEN"
    ZK_INSECURE_SRS = "ZK_INSECURE_SRS"


class WireReason:
    """Reason codes a compressed-tensor wire message is refused with (SPEC III §4.3)."""

    TRUNCATED = "TRUNCATED"
    BAD_MAGIC = "BAD_MAGIC"
    BAD_VERSION = "BAD_VERSION"
    UNKNOWN_CODEC = "UNKNOWN_CODEC"
    BAD_DTYPE = "BAD_DTYPE"
    NDIM_LIMIT = "NDIM_LIMIT"
    ELEMENT_LIMIT = "ELEMENT_LIMIT"
    PAYLOAD_LIMIT = "PAYLOAD_LIMIT"
    LENGTH_MISMATCH = "LENGTH_MISMATCH"
    PAYLOAD_LENGTH = "PAYLOAD_LENGTH"
    BAD_BLOCK = "BAD_BLOCK"
    BAD_LEVELS = "BAD_LEVELS"
    K_RANGE = "K_RANGE"
    INDEX_ORDER = "INDEX_ORDER"
    INDEX_RANGE = "INDEX_RANGE"
    NON_FINITE = "NON_FINITE"
    BAD_SCALE = "BAD_SCALE"
    CODE_RANGE = "CODE_RANGE"
    NONCANONICAL = "NONCANONICAL"


def outcome(code: str) -> str:
    """The outcome of a code: ``reject``, ``inconclusive`` or ``refused`` (KeyError if unknown)."""
    return VOCABULARY[str(code.value if isinstance(code, Enum) else code)].outcome


def meaning(code: str) -> str:
    """The one-line meaning of a code (KeyError if unknown)."""
    return VOCABULARY[str(code.value if isinstance(code, Enum) else code)].meaning
