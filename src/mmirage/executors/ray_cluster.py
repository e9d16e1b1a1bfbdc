"""The driver's connection to a Ray cluster (``mode: ray``): Ray imported as the ``ray`` extra,
the cluster joined (``execution_params.ray.address``, else ``RAY_ADDRESS``, else a local
instance) and its address said once on stderr."""

from __future__ import annotations

import logging
from types import ModuleType
from typing import TYPE_CHECKING, Any

import click

from mmirage.errors import UserError, require_extra

if TYPE_CHECKING:
    from mmirage.config.ray_settings import RayParams


def import_ray() -> ModuleType:
    """The ``ray`` module, or ``MissingExtra`` (exit 2) naming the ``ray`` extra."""
    return require_extra("ray", "ray", "execution_params.mode: ray")


def connect(settings: RayParams) -> ModuleType:
    """Join the cluster (once per process); ``ray``. A cluster that cannot be reached is the
    user's to fix: one sentence naming the address."""
    ray = import_ray()
    if ray.is_initialized():
        return ray
    address = settings.resolved_address()
    options: dict[str, Any] = {"logging_level": logging.WARNING, "log_to_driver": True}
    if settings.runtime_env:
        options["runtime_env"] = dict(settings.runtime_env)
    try:
        ray.init(address=address, **options)
    except (ConnectionError, RuntimeError, ValueError) as exc:
        where = address or "a local instance"
        raise UserError(
            f"execution_params.mode: ray could not join the Ray cluster at {where} ({exc}); "
            "check execution_params.ray.address or RAY_ADDRESS, and that the cluster is up"
        ) from None
    click.echo(f"ray: cluster {cluster_address(ray)}", err=True)
    return ray


def cluster_address(ray: ModuleType) -> str:
    """The address another driver would join (the GCS's host:port)."""
    context = ray.get_runtime_context()
    return str(getattr(context, "gcs_address", None) or "local instance")


def disconnect() -> None:
    ray = import_ray()
    if ray.is_initialized():
        ray.shutdown()
