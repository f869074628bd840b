"""Issue 9 defect 13: the shipper trusts the server, not its cursor.

Over real HTTP (pytest-django's live server): a WAL shipped to one tenant and then to another
(a fresh control plane, as far as the WAL can tell) arrives whole at both; a control plane
restored from a backup that lost its latest records gets them sent again, although this machine's
cursor says they were shipped. The cursor is per destination and never holds the API key.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import sagaplane as sp
from sagaplane.shipper import Shipper, ShipperState

from tenants import founding
from tenants.actors import named_actor
from tenants.models import Role
from tests.support.factories import Person, make_person

REPO = Path(__file__).resolve().parents[2]


def write_wal(path: Path, sagas: int) -> sp.WAL:
    wal = sp.WAL(path, fsync=False)
    for i in range(sagas):
        wal.append("SAGA_START", {"saga_id": f"saga-{i}", "pid": 1, "lease_ttl": 30.0, "name": f"s{i}"})
        wal.append("SAGA_COMPLETE", {"saga_id": f"saga-{i}", "clean": True})
    return wal


def read_wal(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def held(url: str, api_key: str, stream_id: str) -> dict[str, Any]:
    response = sp.Client(url, api_key).stream(stream_id)
    assert response.status == 200, (response.status, response.body)
    return response.body


def ship_cli(wal: Path, url: str, api_key: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SAGAPLANE_")}
    env.update(SAGAPLANE_URL=url, SAGAPLANE_API_KEY=api_key, PYTHONPATH=str(REPO / "sdk"))
    return subprocess.run(
        [sys.executable, "-m", "sagaplane", "ship", str(wal), "--no-progress"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,  # a guard against hanging, not a timing assertion
    )


def other_tenant(slug: str) -> Person:
    tenant = founding.create_tenant(slug, slug.title(), f"founder@{slug}.example", actor=named_actor("test"))
    return make_person(tenant, "agent", Role.OWNER)


def test_a_wal_shipped_to_one_control_plane_arrives_whole_at_a_fresh_one(
    transactional_db: None, live_server: Any, alice: Person, carol: Person, tmp_path: Path
) -> None:
    wal = write_wal(tmp_path / "agent.wal", sagas=5)
    wal.close()
    records = read_wal(wal.path)

    first = ship_cli(wal.path, live_server.url, alice.api_key)
    assert first.returncode == 0 and f"shipped {len(records)} record(s)" in first.stdout, first.stderr
    # The same WAL to a control plane that has never seen it (another tenant, another key).
    second = ship_cli(wal.path, live_server.url, carol.api_key)
    assert second.returncode == 0, second.stderr
    assert (
        f"shipped {len(records)} record(s)" in second.stdout and f"{len(records)} accepted" in second.stdout
    )

    for person in (alice, carol):
        stream = held(live_server.url, person.api_key, wal.stream_id)
        assert stream["length"] == len(records) and stream["head"]["hash"] == records[-1]["_h"]
    # One cursor per destination, none holding a key.
    cursors = sorted(tmp_path.glob("agent.wal.cursor-*.json"))
    assert len(cursors) == 2
    for cursor in cursors:
        text = cursor.read_text()
        assert alice.api_key not in text and carol.api_key not in text
        assert json.loads(text)["offset"] == wal.path.stat().st_size

    # Shipping again to either is a no-op: each cursor agrees with its server's head.
    again = ship_cli(wal.path, live_server.url, carol.api_key)
    assert again.returncode == 0 and "shipped 0 record(s)" in again.stdout, again.stderr


def test_a_server_restored_from_a_backup_gets_its_lost_records_again(
    transactional_db: None, live_server: Any, alice: Person, tmp_path: Path
) -> None:
    wal = write_wal(tmp_path / "agent.wal", sagas=5)
    wal.close()
    records = read_wal(wal.path)
    # This machine shipped everything to `before` and remembers it...
    before = Shipper(wal.path, url=live_server.url, api_key=alice.api_key)
    assert before.run_until_caught_up() == len(records)
    remembered = json.loads(before.cursor_file.read_text())
    # ...then the control plane was restored from a backup taken after the first 6 records: the
    # restored tenant holds those 6, and the cursor this machine keeps for it says "all shipped".
    restored = other_tenant("restored")
    response = sp.Client(live_server.url, restored.api_key).post_records(wal.stream_id, records[:6])
    assert response.status == 200, response.body
    stale = Shipper(wal.path, url=live_server.url, api_key=restored.api_key)
    stale.cursor_file.write_text(json.dumps(remembered))
    shipper = Shipper(wal.path, url=live_server.url, api_key=restored.api_key)
    assert shipper.cursor.offset == wal.path.stat().st_size  # the cursor alone would send nothing

    assert shipper.run_until_caught_up() == len(records) - 6
    assert shipper.accepted == len(records) - 6 and shipper.state is not ShipperState.FAILED
    stream = held(live_server.url, restored.api_key, wal.stream_id)
    assert stream["length"] == len(records) and stream["head"]["hash"] == records[-1]["_h"]


def test_a_server_head_that_is_not_in_the_wal_stops_shipping_naming_it(
    transactional_db: None, live_server: Any, alice: Person, tmp_path: Path
) -> None:
    theirs = write_wal(tmp_path / "theirs.wal", sagas=1)
    theirs.close()
    ours = write_wal(tmp_path / "ours.wal", sagas=2)
    ours.close()
    foreign = read_wal(theirs.path)
    # The server's stream of this name came from another WAL.
    response = sp.Client(live_server.url, alice.api_key).post_records(ours.stream_id, foreign)
    assert response.status == 200, response.body

    done = ship_cli(ours.path, live_server.url, alice.api_key)
    assert done.returncode == 1
    assert foreign[-1]["_h"] in done.stderr and "not in" in done.stderr
    assert held(live_server.url, alice.api_key, ours.stream_id)["length"] == len(foreign)
