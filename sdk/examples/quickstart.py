import sagaplane as sp


# Stand-ins for your real clients: a payment provider and a mailer.
def charge_card(customer: str, amount: int) -> dict:
    return {"id": f"ch_{customer}_{amount}"}


def refund_card(charge_id: str, idempotency_key: str) -> None:
    print(f"refunded {charge_id}")


def send_receipt(to: str, amount: int) -> None:
    print(f"receipt for {amount} sent to {to}")


@sp.compensator("shop.refund")  # a named compensator: another process can run it after a crash
def refund(charge_id: str, idempotency_key: str) -> None:
    refund_card(charge_id, idempotency_key=idempotency_key)


charge = sp.tool(
    charge_card,
    name="payments.charge",
    semantics=sp.COMPENSABLE,
    compensate=lambda result: sp.undo("shop.refund", charge_id=result["id"]),
)
send_email = sp.tool(send_receipt, name="mailer.send", semantics=sp.IRREVERSIBLE)

sp.configure("agent.wal", agent="checkout-bot")  # opens the WAL; ships to SAGAPLANE_URL in the background

with sp.saga(name="checkout", confirm=lambda req: req.kwargs["amount"] < 100) as saga:
    c = charge(customer="c_1", amount=42)
    send_email(to="c_1@example.com", amount=42)

print(f"saga {saga.saga_id}: {sp.status()['state']}")  # "ready": the gate has the fleet's state
sp.shutdown()  # waits until the control plane holds every record: the saga is on the Sagas page
