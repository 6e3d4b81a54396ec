"""Replay tokens: one line that reruns exactly one scenario of one test.

A token is `hcc1-` and the URL-safe base64 of the zlib-compressed JSON {"v": hccl-sim's version,
"t": the first 12 hex digits of the test's id's BLAKE2b, "p": the plan as FaultPlan.to_dict
writes it}. The plan is the whole scenario (the test gives topology, engine and environment),
so the same token gives the same run, to the nanosecond, on every machine and engine. A token
of another test or another version is refused, saying which.
"""
from __future__ import annotations

import base64
import hashlib
import json
import zlib

from topologies.errors import HcclError

from ..faults.fault_plan import FaultPlan

PREFIX = "hcc1-"


def _version() -> str:
    from .. import __version__
    return __version__


def test_key(test_id: str) -> str:
    return hashlib.blake2b(test_id.encode(), digest_size=6).hexdigest()


def encode(test_id: str, plan: FaultPlan) -> str:
    """The token that replays `plan` on the test `test_id` (a pytest node id, or any name)."""
    body = json.dumps({"v": _version(), "t": test_key(test_id), "p": plan.to_dict()}, separators=(",", ":"),
                      sort_keys=True)
    return PREFIX + base64.urlsafe_b64encode(zlib.compress(body.encode(), 9)).decode().rstrip("=")


def decode(token: str, test_id: str) -> FaultPlan:
    """The plan of `token`, checked to be this version's and this test's."""
    if not isinstance(token, str) or not token.startswith(PREFIX):
        raise HcclError("E_PARA", f"not an hccl-sim replay token (they start {PREFIX!r}): {str(token)[:40]!r}")
    try:
        raw = token[len(PREFIX):]
        body = json.loads(zlib.decompress(base64.urlsafe_b64decode(raw + "=" * (-len(raw) % 4))))
        version, key, plan = body["v"], body["t"], body["p"]
    except (ValueError, KeyError, TypeError, zlib.error):
        raise HcclError("E_PARA", f"the replay token {token[:24]}... is damaged (copy the whole line)") from None
    if version != _version():
        raise HcclError("E_PARA", f"the replay token was made by hccl-sim {version}, this is {_version()}: "
                        "rerun the fault suite to get a token of this version")
    if key != test_key(test_id):
        raise HcclError("E_PARA", f"the replay token is another test's, not {test_id}'s")
    return FaultPlan.from_dict(plan)
