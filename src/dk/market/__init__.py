"""dk.market: a small market that pays only for verified training (spec: SPEC.md Part V).

Ledger in SQLite (WAL) with a hash-chained event log; Ed25519-signed requests; orders, bids and
price-time matching; escrow; results verified by the market and attested by k of n validators
(BLS aggregates); a challenge window with bisection and replay; an audit of the whole ledger.
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
