#!/usr/bin/env python3
"""Drive lbd over its socket without lbctl (docs/API.md): one JSON request
per connection, one JSON answer line back. Standard library only.

  lbd_api.py [--socket PATH] health
  lbd_api.py [--socket PATH] drain VIP BACKEND   # drain, then wait until empty
"""
import ipaddress
import json
import socket
import sys
import time

API = 2


def call(path, request):
    """Sends one request; returns the answer's data or raises with lbd's code."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.settimeout(30)
        s.connect(path)
        s.sendall(json.dumps({"api": API, **request}).encode() + b"\n")
        answer = s.makefile("rb").readline(64 << 20)
    response = json.loads(answer)
    if not response["ok"]:
        raise RuntimeError(f"{response.get('code')}: {response.get('error')}")
    return response["data"]


def vip_key(vip):
    """10.0.0.1:80/tcp, [2001:db8::1]:443/TCP or 10.0.0.1:all/udp as a
    comparable (address, port, protocol): lbd writes VIPs its own way."""
    hostport, proto = vip.rsplit("/", 1)
    host, port = hostport.rsplit(":", 1)
    port = 0 if port in ("*", "all") else int(port)
    return ipaddress.ip_address(host.strip("[]")), port, proto.lower()


def health(path):
    for vip in call(path, {"op": "health"}):
        for b in vip["backends"]:
            flows = b.get("live_flows")
            print(vip["vip"], b["address"], b["state"], "-" if flows is None else flows)


def drain(path, vip, backend):
    """Drains; follows the backend until lbd says the drain ended (drained,
    cut at drain_timeout, or undrained by someone else)."""
    done = call(path, {"op": "backend", "action": "drain", "vip": vip, "address": backend})
    print("revision", done["revision"])
    key, address = vip_key(vip), ipaddress.ip_address(backend)
    while True:
        vips = call(path, {"op": "vip", "action": "list"})
        b = next(
            (
                b
                for v in vips
                if vip_key(v["vip"]) == key
                for b in v["backends"]
                if ipaddress.ip_address(b["address"]) == address
            ),
            None,
        )
        if b is None or b["state"] not in ("draining", "drained"):
            sys.exit(f"{backend} is no longer draining")
        if b["state"] == "drained":
            print(backend, "drained")
            return
        if not b["usable"]:
            sys.exit(f"drain_timeout cut {b.get('live_flows')} flows")
        flows = b.get("live_flows")
        print(backend, "live flows", "-" if flows is None else flows)
        time.sleep(1)


def main(argv):
    path = "/run/lb/default.sock"
    if argv[:1] == ["--socket"]:
        path, argv = argv[1], argv[2:]
    try:
        if argv == ["health"]:
            health(path)
        elif len(argv) == 3 and argv[0] == "drain":
            drain(path, argv[1], argv[2])
        else:
            sys.exit(__doc__)
    except (OSError, ValueError, RuntimeError) as e:
        # A refusal (lbd's code and message), no lbd, a bad argument.
        sys.exit(f"lbd_api.py: {e}")


if __name__ == "__main__":
    main(sys.argv[1:])
