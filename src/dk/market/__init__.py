"""dk.market: a small market that pays only for verified training (spec: SPEC.md Part V).

Ledger in SQLite (WAL) with a hash-chained event log and its own clock; Ed25519-signed
requests; orders, bids and price-time matching; escrow; staked validators drawn per order, whose
BLS shares fix the challenge beacon; results verified by the market (accept, reject or
inconclusive) and attested by k of the n drawn validators (BLS aggregates); a challenge window
with bisection and replay that slashes wrong attesters; an audit of the whole ledger.
The market never imports the prover.
"""

from dk.market.attest import BlsKey as BlsKey
from dk.market.audit import AuditReport as AuditReport
from dk.market.config import MarketConfig as MarketConfig
from dk.market.errors import MarketRefused as MarketRefused
from dk.market.market import Market as Market
from dk.market.requests import Client as Client
from dk.market.requests import parse_request as parse_request
from dk.market.requests import sign_request as sign_request
from dk.market.results import bundle_commitment as bundle_commitment

__all__ = [
    "AuditReport",
    "BlsKey",
    "Client",
    "Market",
    "MarketConfig",
    "MarketRefused",
    "bundle_commitment",
    "parse_request",
    "sign_request",
]
