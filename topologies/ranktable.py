"""HCCL rank-table JSON import and export: version "1.0" (the A2 / 910A template) and "1.2" (the
A3 superpod template: `super_pod_list` and each device's `super_device_id`).

Validation follows HCCL's rules (docs/references.md §8.1, §8.2): every value is a JSON string; `status`
must be "completed"; `server_count` equals the number of servers; `server_id` is unique and at
most 64 characters; `device_id` is a physical id in [0, the preset's max_device_id] (HCCL's parser's
limit on the device: 7 on 910A and the A2 preset's one module, 15 on A3), unique in its server,
gaps allowed;
`device_ip` is a dotted IPv4 address, required when there is more than one server; `rank_id`s are
unique, cover 0..N-1, and each server's ranks are one contiguous run (ranks never interleave
across servers). Version 1.2 adds `super_pod_list` (every server in exactly one superpod, a
superpod's servers contiguous) and a `super_device_id` per device, unique in its superpod; it
describes atlas900-a3 servers. A bad file raises HcclError naming the field, where it is and what
was expected.
"""
from __future__ import annotations

import ipaddress
import json
import re
from pathlib import Path

from .errors import HcclError
from .model import Topology
from .presets import hardware, hardware_name, max_device_id, preset_data

SUPPORTED_VERSION = "1.0"
SUPERPOD_VERSION = "1.2"
SUPERPOD_PRESET = "atlas900-a3"
_ASCII_DIGITS = re.compile(r"[0-9]+")


def _fail(where: str, message: str, path: str) -> HcclError:
    return HcclError("E_PARA", f"rank table {path}: {where}: {message}")


def _string(obj: dict, key: str, where: str, path: str, required: bool = True):
    if key not in obj:
        if required:
            raise _fail(where, f'missing required field "{key}"', path)
        return None
    value = obj[key]
    if not isinstance(value, str):
        raise _fail(f"{where}.{key}", f"must be a JSON string, got {type(value).__name__} {value!r}", path)
    return value


def _unique(seen: dict, value, index, where: str, listed: str, path: str) -> None:
    """Record `value` as entry `index` of `listed`, or fail naming the entry it duplicates."""
    if value in seen:
        raise _fail(where, f"{value!r} duplicates {listed}[{seen[value]}]", path)
    seen[value] = index


def _int_string(obj: dict, key: str, where: str, path: str, lo: int, hi: int, required: bool = True):
    text = _string(obj, key, where, path, required)
    if text is None:
        return None
    # str.isdigit accepts "²" and other Unicode digits; HCCL reads ASCII decimal only.
    if not _ASCII_DIGITS.fullmatch(text):
        raise _fail(f"{where}.{key}", f"must be a decimal integer string (ASCII digits 0-9), got {text!r}", path)
    if len(text.lstrip("0")) > len(str(hi)):
        raise _fail(f"{where}.{key}", f"{text[:24]}{'...' if len(text) > 24 else ''} is out of range [{lo}, {hi}]", path)
    value = int(text)
    if not lo <= value <= hi:
        raise _fail(f"{where}.{key}", f"{value} is out of range [{lo}, {hi}]", path)
    return value


def parse(table: dict, preset: str | None = None, path: str = "<dict>") -> Topology:
    """Validate a rank table (already decoded from JSON) and build its topology on `preset` servers
    (default: atlas900-a3 for a version 1.2 table, atlas800t-a2 otherwise)."""
    if not isinstance(table, dict):
        raise _fail("top level", f"must be a JSON object, got {type(table).__name__}", path)
    version = _string(table, "version", "top level", path)
    if version not in (SUPPORTED_VERSION, SUPERPOD_VERSION):
        raise _fail("version", f'unsupported version {version!r}; expected "{SUPPORTED_VERSION}" or '
                    f'"{SUPERPOD_VERSION}" (A3 superpods)', path)
    superpod = version == SUPERPOD_VERSION
    preset = hardware_name(preset if preset is not None else SUPERPOD_PRESET if superpod else "atlas800t-a2")
    if superpod != (preset == SUPERPOD_PRESET):
        raise _fail("version", f'a version {version} table describes {"A3 superpod" if superpod else "A2/910A"} '
                    f'servers, not {preset} ones', path)
    status = _string(table, "status", "top level", path)
    if status != "completed":
        raise _fail("status", f'is {status!r}; the table is usable only when "completed"', path)
    servers = table.get("server_list")
    if not isinstance(servers, list) or not servers:
        raise _fail("server_list", "must be a non-empty JSON array", path)
    count = _int_string(table, "server_count", "top level", path, 1, 1 << 20, required=not superpod)
    if count is not None and count != len(servers):
        raise _fail("server_count", f"says {count} but server_list holds {len(servers)} servers", path)
    npus, most_id = int(preset_data(preset)["npus_per_server"]), max_device_id(preset)
    seen_ids, seen_ips, rank_owner = {}, {}, {}
    server_ids, per_server = [], []
    for s, server in enumerate(servers):
        where = f"server_list[{s}]"
        if not isinstance(server, dict):
            raise _fail(where, "must be a JSON object", path)
        sid = _string(server, "server_id", where, path)
        if not sid or len(sid) > 64:
            raise _fail(f"{where}.server_id", f"must be 1..64 characters, got {sid!r}", path)
        _unique(seen_ids, sid, s, f"{where}.server_id", "server_list", path)
        devices = server.get("device")
        if not isinstance(devices, list) or not devices:
            raise _fail(f"{where}.device", "must be a non-empty JSON array", path)
        if len(devices) > npus:
            raise _fail(f"{where}.device", f"lists {len(devices)} devices; a {preset} server has {npus}", path)
        entries, dev_seen = [], {}
        for d, dev in enumerate(devices):
            dwhere = f"{where}.device[{d}]"
            if not isinstance(dev, dict):
                raise _fail(dwhere, "must be a JSON object", path)
            device_id = _int_string(dev, "device_id", dwhere, path, 0, most_id)
            if device_id in dev_seen:
                raise _fail(f"{dwhere}.device_id", f"{device_id} duplicates device[{dev_seen[device_id]}] of this server", path)
            dev_seen[device_id] = d
            rank_id = _int_string(dev, "rank_id", dwhere, path, 0, 1 << 24)
            if rank_id in rank_owner:
                raise _fail(f"{dwhere}.rank_id", f"{rank_id} duplicates {rank_owner[rank_id]}", path)
            rank_owner[rank_id] = dwhere
            ip = _string(dev, "device_ip", dwhere, path, required=len(servers) > 1)
            if ip is not None:
                try:
                    ipaddress.IPv4Address(ip)
                except ValueError:
                    raise _fail(f"{dwhere}.device_ip", f"{ip!r} is not a dotted IPv4 address", path)
                if ip in seen_ips:
                    raise _fail(f"{dwhere}.device_ip", f"{ip} duplicates {seen_ips[ip]}", path)
                seen_ips[ip] = dwhere
            _int_string(dev, "device_port", dwhere, path, 1, 65535, required=False)
            _string(dev, "host_ip", dwhere, path, required=False)
            sdid = _int_string(dev, "super_device_id", dwhere, path, 0, (1 << 32) - 1, required=superpod)
            entries.append((rank_id, device_id, ip, sdid))
        entries.sort()
        ranks = [e[0] for e in entries]
        if ranks != list(range(ranks[0], ranks[0] + len(ranks))):
            raise _fail(f"{where}.device", f"rank_ids {ranks} are not one contiguous run: ranks must not "
                        "interleave across servers", path)
        server_ids.append(sid)
        per_server.append(entries)
    total = len(rank_owner)
    if sorted(rank_owner) != list(range(total)):
        missing = sorted(set(range(total)) - set(rank_owner))
        raise _fail("rank_id", f"rank ids must cover 0..{total - 1}; missing {missing[:8]}", path)
    order = sorted(range(len(per_server)), key=lambda s: per_server[s][0][0])
    per_server = [per_server[s] for s in order]
    server_ids = [server_ids[s] for s in order]
    pods = _superpods(table, server_ids, per_server, path) if superpod else None
    return hardware(preset, devices_per_server=[len(e) for e in per_server],
                    server_ids=server_ids, device_ids=[[e[1] for e in entries] for entries in per_server],
                    device_ips=[e[2] for entries in per_server for e in entries], pod_of_server=pods)


def _superpods(table, server_ids, per_server, path) -> list:
    """Each server's superpod index (in rank order) from a version 1.2 table's super_pod_list."""
    pods = table.get("super_pod_list")
    if not isinstance(pods, list) or not pods:
        raise _fail("super_pod_list", "must be a non-empty JSON array (version 1.2)", path)
    pod_of, names = {}, {}
    for k, pod in enumerate(pods):
        where = f"super_pod_list[{k}]"
        if not isinstance(pod, dict):
            raise _fail(where, "must be a JSON object", path)
        name = _string(pod, "super_pod_id", where, path)
        _unique(names, name, k, f"{where}.super_pod_id", "super_pod_list", path)
        members = pod.get("server_list")
        if not isinstance(members, list) or not members:
            raise _fail(f"{where}.server_list", "must be a non-empty JSON array", path)
        for j, m in enumerate(members):
            sid = _string(m, "server_id", f"{where}.server_list[{j}]", path) if isinstance(m, dict) else None
            if sid is None:
                raise _fail(f"{where}.server_list[{j}]", "must be an object with a server_id", path)
            if sid not in server_ids:
                raise _fail(f"{where}.server_list[{j}].server_id", f"{sid!r} is not in server_list", path)
            if sid in pod_of:
                raise _fail(f"{where}.server_list[{j}].server_id", f"{sid!r} is already in superpod "
                            f"{pods[pod_of[sid]]['super_pod_id']!r}", path)
            pod_of[sid] = k
    missing = [sid for sid in server_ids if sid not in pod_of]
    if missing:
        raise _fail("super_pod_list", f"servers {missing[:4]} are in no superpod", path)
    order = [pod_of[sid] for sid in server_ids]
    seen = []
    for k in order:
        if seen and seen[-1] != k and k in seen:
            raise _fail("super_pod_list", f"the servers of superpod {pods[k]['super_pod_id']!r} are not contiguous "
                        "in rank order (a superpod's ranks must be one run)", path)
        if not seen or seen[-1] != k:
            seen.append(k)
    sdids = {}
    for s, entries in enumerate(per_server):
        for rank, _, _, sdid in entries:
            key = (order[s], sdid)
            if key in sdids:
                raise _fail("super_device_id", f"{sdid} of rank {rank} duplicates rank {sdids[key]}'s in superpod "
                            f"{pods[order[s]]['super_pod_id']!r}", path)
            sdids[key] = rank
    renumber = {k: i for i, k in enumerate(seen)}     # superpods numbered in rank order
    return [renumber[k] for k in order]


def load(path: str | Path, preset: str | None = None) -> Topology:
    """Read and validate a rank-table file (preset as for `parse`)."""
    p = Path(path)
    preset = None if preset is None else hardware_name(preset)
    try:
        raw = p.read_bytes()
    except OSError as exc:
        raise HcclError("E_OPEN_FILE_FAILURE", f"rank table {path}: cannot read: {exc.strerror or exc}")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise HcclError("E_PARA", f"rank table {path}: not UTF-8 text (byte 0x{raw[exc.start]:02x} at offset "
                        f"{exc.start})")
    try:
        table = json.loads(text)
    except json.JSONDecodeError as exc:
        raise HcclError("E_PARA", f"rank table {path}: invalid JSON at line {exc.lineno} column {exc.colno}: {exc.msg}")
    except RecursionError:      # json's decoder recurses once per level of nesting
        raise HcclError("E_PARA", f"rank table {path}: JSON nested too deeply to be a rank table "
                        "(a rank table nests 4 levels)") from None
    except ValueError as exc:    # e.g. a 5,000-digit number literal
        raise HcclError("E_PARA", f"rank table {path}: invalid JSON: {exc}") from None
    topo = parse(table, preset=preset, path=str(path))
    topo.name = str(path)
    return topo


def to_dict(topo: Topology) -> dict:
    """The HCCL rank table describing `topo`'s servers and devices (version 1.2 for superpods)."""
    server_list = []
    ranks_of = {}
    for r, s in enumerate(topo.server_of):      # one pass: ranks_of_server per server is quadratic
        ranks_of.setdefault(s, []).append(r)
    for s in sorted(ranks_of):
        devices = []
        for r in ranks_of[s]:
            d = topo.device_of[r]
            ip = topo.device_ips[r] if topo.device_ips and topo.device_ips[r] else f"10.{s // 256}.{s % 256}.{10 + d}"
            devices.append({"device_id": str(d), "device_ip": ip, "rank_id": str(r)})
        sid = topo.server_ids[s] if topo.server_ids else f"node_{s}"
        server_list.append({"server_id": sid, "device": devices})
    table = {"status": "completed", "version": SUPPORTED_VERSION,
             "server_count": str(len(server_list)), "server_list": server_list}
    pod_of_server = topo.params.get("superpod_of_server")
    if pod_of_server is not None:
        table["version"] = SUPERPOD_VERSION
        members, index_in_pod = {}, {}
        for s, k in enumerate(pod_of_server):
            index_in_pod[s] = len(members.setdefault(k, []))
            members[k].append({"server_id": server_list[s]["server_id"]})
        for s, server in enumerate(server_list):
            for dev in server["device"]:      # SDID: unique in the superpod (server slot, die)
                dev["super_device_id"] = str(index_in_pod[s] * 64 + int(dev["device_id"]))
        table["super_pod_list"] = [{"super_pod_id": str(k), "server_list": m} for k, m in sorted(members.items())]
    return table


def save(topo: Topology, path: str | Path) -> None:
    Path(path).write_text(json.dumps(to_dict(topo), indent=2) + "\n", encoding="utf-8")
