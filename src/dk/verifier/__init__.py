"""The verifier: integrity, challenge derivation, replay, report. Imports crypto + pol only."""

from dk.verifier.replay import replay_interval as replay_interval
from dk.verifier.report import Finding as Finding
from dk.verifier.report import Reason as Reason
from dk.verifier.report import Report as Report
from dk.verifier.verify import verify_bundle as verify_bundle

__all__ = ["Finding", "Reason", "Report", "replay_interval", "verify_bundle"]
