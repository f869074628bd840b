"""Posting a request's channel message is leased work (core.claims): one worker holds the claim
under a fencing token; a worker that died while posting leaves a lease that lapses, after which
another posts the message, and the dead one's late answer records nothing."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from core.scoping import tenant_context
from slackapp import decisions, services, tasks
from slackapp.models import MessageState, RequestMessage
from tenants.models import Tenant
from tests.slackapp.slack_server import FakeSlack
from tests.support.approvals import Agent, wire_policy
from tests.support.factories import Person
from tests.support.scoping import in_tenant
from tests.support.slack import browser, install


def _lapse(tenant: Tenant, request_id: str) -> None:
    with tenant_context(tenant):
        RequestMessage.objects.filter(request_id=request_id).update(
            lease_until=timezone.now() - timedelta(seconds=1)
        )


def _row(tenant: Tenant, request_id: str) -> RequestMessage:
    with tenant_context(tenant):
        return RequestMessage.objects.get(request_id=request_id)


@pytest.mark.django_db
def test_one_worker_holds_the_claim_and_a_stale_token_records_nothing(tenant_a: Tenant) -> None:
    first = in_tenant(services.claim_message_post, tenant_a, "r1")
    assert first is not None
    assert in_tenant(services.claim_message_post, tenant_a, "r1") is None  # held, its lease running
    _lapse(tenant_a, "r1")
    second = in_tenant(services.claim_message_post, tenant_a, "r1")
    assert second == first + 1
    assert not in_tenant(services.message_posted, tenant_a, "r1", first, channel_id="C1", ts="1.1")
    assert _row(tenant_a, "r1").ts == ""
    in_tenant(services.release_message_claim, tenant_a, "r1", first)  # stale: gives nothing back
    assert in_tenant(services.claim_message_post, tenant_a, "r1") is None
    assert in_tenant(services.message_posted, tenant_a, "r1", second, channel_id="C1", ts="2.2")
    row = _row(tenant_a, "r1")
    assert (row.state, row.channel_id, row.ts) == (MessageState.POSTED, "C1", "2.2")
    assert in_tenant(services.claim_message_post, tenant_a, "r1") is None  # posted: never claimed again
    assert in_tenant(services.is_posted, tenant_a, "r1")


@pytest.mark.django_db
def test_a_failed_post_gives_the_claim_back_at_once(tenant_a: Tenant) -> None:
    token = in_tenant(services.claim_message_post, tenant_a, "r2")
    assert token is not None
    in_tenant(services.release_message_claim, tenant_a, "r2", token)
    assert _row(tenant_a, "r2").state == MessageState.QUEUED
    assert in_tenant(services.claim_message_post, tenant_a, "r2") == token + 1
    assert not in_tenant(services.is_posted, tenant_a, "r2")


@pytest.mark.django_db
def test_a_post_whose_worker_died_is_posted_once_by_the_next_after_the_lease(
    slack: FakeSlack, agent: Agent, alice: Person
) -> None:
    install(browser(alice.user), slack)
    wire_policy(agent.tenant)
    request_id = str(agent.ask(amount=100, currency="EUR", to="DE89370400440532013000")["approval_id"])
    dead = in_tenant(services.claim_message_post, agent.tenant, request_id)  # then killed before posting
    assert dead is not None
    with pytest.raises(decisions.NotPostedYet):
        tasks.post_request(agent.tenant.pk, request_id)  # waits (retried) while the lease runs
    assert slack.channel_messages("C0RISK") == []
    _lapse(agent.tenant, request_id)
    tasks.post_request(agent.tenant.pk, request_id)
    (message,) = slack.channel_messages("C0RISK")
    assert not in_tenant(
        services.message_posted, agent.tenant, request_id, dead, channel_id="C0RISK", ts="9.9"
    )
    row = _row(agent.tenant, request_id)
    assert (row.state, row.token, row.ts) == (MessageState.POSTED, dead + 1, message.ts)
    tasks.post_request(agent.tenant.pk, request_id)  # a repeated task posts nothing more
    assert len(slack.channel_messages("C0RISK")) == 1
