"""One answer on every page (issue 23): a saga whose lease expired is shown "orphaned — recovery
starting" and then "started at …", never running; the Sagas banner and the Recovery page count
the same sagas as needing a human (partial rollbacks and recovery steps waiting for a decision),
so the Recovery page never says "Nothing waits for a human" while the banner counts some."""

from __future__ import annotations

import re

import pytest
from django.test import Client

from recovery.tasks import sweep_tenant
from tests.recovery.sagas import crashed, expire
from tests.support.chains import Writer
from tests.support.factories import Person

pytestmark = pytest.mark.django_db


def browser(person: Person) -> Client:
    client = Client()
    client.force_login(person.user)
    return client


def test_an_expired_lease_is_orphaned_with_recovery_starting_then_started(alice: Person) -> None:
    tenant = alice.tenant
    crashed(Writer(tenant, "agent-a-1"), "lapsed", steps=2, lease_ttl=600)
    client = browser(alice)
    timeline = client.get("/sagas/lapsed/timeline").content.decode()
    assert 'data-status="running"' in timeline and 'id="orphan-note"' not in timeline
    assert "data-stale-at=" in timeline  # the page fetches itself again when the lease expires
    expire(tenant, "lapsed")
    timeline = client.get("/sagas/lapsed/timeline").content.decode()
    assert 'data-status="running"' not in timeline and 'data-status="orphaned"' in timeline
    assert re.search(r'id="orphan-note" data-phase="starting">orphaned — recovery starting', timeline)
    assert "data-stale-at=" in timeline  # again until recovery has started
    # Recovery is on it: no human is needed for that, on either page.
    assert 'id="needs-human"' not in client.get("/sagas/").content.decode()
    assert 'id="queue-empty"' in client.get("/recovery/").content.decode()
    sweep_tenant(tenant)
    timeline = client.get("/sagas/lapsed/timeline").content.decode()
    assert 'data-status="recovering"' in timeline
    assert re.search(r'id="orphan-note" data-phase="started">orphaned — recovery started at <time', timeline)


def test_the_sagas_banner_and_the_recovery_page_count_the_same_sagas(alice: Person) -> None:
    tenant = alice.tenant
    writer = Writer(tenant, "agent-a-1")
    crashed(writer, "wire", steps=1, semantics="IRREVERSIBLE", last="STEP_UNKNOWN", lease_ttl=600)
    crashed(writer, "partial", steps=1, end="SAGA_ABORTED")  # the agent's own rollback, unclean
    crashed(writer, "lapsed", steps=1, lease_ttl=600)
    expire(tenant, "wire")
    expire(tenant, "lapsed")
    client = browser(alice)
    sagas = client.get("/sagas/").content.decode()
    recovery = client.get("/recovery/").content.decode()
    # Before the sweep: only the partial rollback needs a human (the lapsed ones: recovery starting).
    assert "1 saga needs a human" in sagas
    assert 'data-count="1"' in recovery and 'id="queue-empty"' not in recovery
    assert 'data-saga="partial"' in recovery
    sweep_tenant(tenant)  # "wire" escalates (unknown outcome of an irreversible step)
    sagas = client.get("/sagas/").content.decode()
    recovery = client.get("/recovery/").content.decode()
    assert "2 sagas need a human" in sagas
    assert 'data-count="2"' in recovery and 'id="queue-empty"' not in recovery
    assert 'data-saga="wire"' in recovery and 'data-saga="partial"' in recovery
    rows = {m.group(1): m.group(0) for m in re.finditer(r'<tr data-saga="([^"]+)"[^>]*>', sagas)}
    assert 'class="needs-human"' in rows["wire"] and 'class="needs-human"' in rows["partial"]
    assert 'class="needs-human"' not in rows["lapsed"]
