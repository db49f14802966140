"""Joining Ray, shared by the verifier's Ray executor and the data-parallel launcher."""

from __future__ import annotations

import os
from typing import Any


def ensure_ray(ray: Any, address: str, num_cpus: int | None) -> None:
    """Start a local Ray (``address == "local"``, ``num_cpus`` CPUs) or join ``address``,
    quietly (no dashboard, no driver logs), unless this process is already connected."""
    if ray.is_initialized():
        return
    os.environ.setdefault("RAY_ACCEL_ENV_VAR_OVERRIDE_ON_ZERO", "0")
    if address == "local":
        ray.init(
            num_cpus=num_cpus, include_dashboard=False, log_to_driver=False, configure_logging=False
        )
    else:
        ray.init(address=address, log_to_driver=False, configure_logging=False)
