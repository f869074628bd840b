"""Sagaplane SDK: transactional safety for AI-agent tool calls.

import sagaplane as sp

@sp.compensator("shop.refund")
def refund(charge_id, idempotency_key=None): ...

charge = sp.tool(charge_card, semantics=sp.COMPENSABLE,
                 compensate=lambda r: sp.undo("shop.refund", charge_id=r["id"]))

sp.configure("agent.wal")            # ships to SAGAPLANE_URL when set
with sp.saga(name="checkout"):
    charge(amount=42)
"""

from __future__ import annotations

from ._version import __version__
from .chain import ChainBreak, ChainReport, verify_chain
from .client import AuthenticationError, Client, ConfigurationError, SagaplaneError, TransportError
from .credentials import EnvSecrets, Secret, SecretError, SecretUnresolved, secret
from .gate import GateDenied, guarantees
from .reconcile import ReconcileWorker, reconciler, registered_reconcilers
from .reservations import settle
from .retry import Retry
from .runtime import Runtime, configure, get_runtime, shutdown, status
from .saga import (
    ConfirmRequest,
    EffectNotApplied,
    IrreversibleRefused,
    RollbackReport,
    Saga,
    SagaAborted,
    SagaError,
    Step,
    StepState,
    current_saga,
    refuse_irreversible,
    saga,
    tool,
)
from .semantics import (
    COMPENSABLE,
    IRREVERSIBLE,
    PREVIEW,
    REVERSIBLE,
    Compensation,
    Semantics,
    compensator,
    idempotency_key,
    registered_compensators,
    resolve_compensator,
    undo,
)
from .shipper import Backoff, ShipFailed, Shipper, ShipperState
from .wal import WAL, WALError, WALLocked
from .worker import Worker

__all__ = [
    "GateDenied",
    "guarantees",
    "status",
    "AuthenticationError",
    "Backoff",
    "COMPENSABLE",
    "ChainBreak",
    "ChainReport",
    "Client",
    "Compensation",
    "ConfigurationError",
    "ConfirmRequest",
    "EffectNotApplied",
    "IRREVERSIBLE",
    "IrreversibleRefused",
    "PREVIEW",
    "REVERSIBLE",
    "RollbackReport",
    "ReconcileWorker",
    "Retry",
    "Secret",
    "SecretError",
    "SecretUnresolved",
    "EnvSecrets",
    "Runtime",
    "Saga",
    "SagaAborted",
    "SagaError",
    "SagaplaneError",
    "Semantics",
    "ShipFailed",
    "Shipper",
    "ShipperState",
    "Step",
    "StepState",
    "TransportError",
    "WAL",
    "WALError",
    "WALLocked",
    "Worker",
    "__version__",
    "compensator",
    "configure",
    "current_saga",
    "get_runtime",
    "idempotency_key",
    "reconciler",
    "refuse_irreversible",
    "registered_reconcilers",
    "registered_compensators",
    "resolve_compensator",
    "saga",
    "secret",
    "settle",
    "shutdown",
    "tool",
    "undo",
    "verify_chain",
]
