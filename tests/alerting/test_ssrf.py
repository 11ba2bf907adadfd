"""Webhooks reach only global addresses unless the deployment allows private ones: literal
private hosts (in every spelling) are refused at registration, names are checked on the
addresses they resolve to at delivery (against a real receiver on loopback), and a failed
attempt records a class of failure, never the socket's errno text (no port-scan oracle)."""

from __future__ import annotations

import ipaddress
from collections.abc import Iterator

import httpx
import pytest

from curvecast.service.alerting.targets import (
    TargetNotAllowed,
    carried_ipv4,
    is_allowed_address,
    literal_address,
    pick_address,
)
from curvecast.service.config import Settings
from curvecast.service.worker.webhooks import send_http
from tests._servers import thread_server
from tests.alerting.conftest import Receiver
from tests.support import free_port

REFUSED = [
    "127.0.0.1", "127.1", "2130706433", "0x7f.1", "0177.0.0.1", "10.1.2.3", "172.16.0.9",
    "192.168.1.1", "169.254.169.254", "100.64.0.1", "0.0.0.0", "224.0.0.1", "::1", "[::1]",
    "::ffff:127.0.0.1", "[::ffff:169.254.169.254]", "fe80::1", "fc00::1", "::",
]
#: IPv6 forms that carry a private IPv4 address (a gateway, tunnel or the host's stack reaches
#: it): IPv4-compatible, NAT64, 6to4, Teredo (client 127.0.0.1), and IPv4-mapped "this host".
CARRYING_PRIVATE = [
    "::7f00:1", "[::127.0.0.1]", "::a00:1", "64:ff9b::7f00:1", "[64:ff9b::a9fe:a9fe]",
    "64:ff9b::a00:1", "2002:7f00:1::", "[2002:a9fe:a9fe::1]", "2002:c0a8:101::",
    "2001:0:4136:e378:8000:63bf:80ff:fffe", "::ffff:0.0.0.0",
]
ALLOWED = ["8.8.8.8", "1.1.1.1", "2001:4860:4860::8888", "[2606:4700:4700::1111]",
           "64:ff9b::808:808", "2002:808:808::1", "::ffff:8.8.8.8"]


@pytest.mark.parametrize("host", REFUSED + CARRYING_PRIVATE)
def test_private_loopback_link_local_and_reserved_are_refused(host: str) -> None:
    ip = literal_address(host)
    assert ip is not None, host
    assert not is_allowed_address(ip, allow_private=False)


@pytest.mark.parametrize("host", ALLOWED)
def test_global_addresses_are_allowed(host: str) -> None:
    ip = literal_address(host)
    assert ip is not None and is_allowed_address(ip, allow_private=False)


def test_names_are_not_literals_and_the_setting_allows_private_but_not_unspecified() -> None:
    assert literal_address("hooks.example.com") is None
    assert literal_address("localhost") is None
    assert is_allowed_address(ipaddress.ip_address("127.0.0.1"), allow_private=True)
    assert not is_allowed_address(ipaddress.ip_address("0.0.0.0"), allow_private=True)


def test_one_private_answer_among_public_ones_refuses_the_name() -> None:
    assert pick_address(["8.8.8.8"], host="x", allow_private=False) == "8.8.8.8"
    with pytest.raises(TargetNotAllowed):
        pick_address(["8.8.8.8", "10.0.0.1"], host="x", allow_private=False)
    with pytest.raises(TargetNotAllowed):
        pick_address([], host="x", allow_private=False)


@pytest.fixture(scope="module")
def strict_server(database_url: str) -> Iterator[str]:
    settings = Settings(database_url=database_url, worker_enabled=False,
                        webhook_allow_private=False)
    with thread_server(settings) as url:
        yield url


@pytest.mark.parametrize("url", [
    "http://127.0.0.1:5432/", "http://2130706433/hook", "http://0x7f.1/", "http://[::1]:8000/",
    "http://169.254.169.254/latest/meta-data/", "http://[::ffff:10.0.0.1]/",
    "http://[::7f00:1]/", "http://[64:ff9b::7f00:1]:5432/", "http://[2002:7f00:1::]/",
    "http://[2001:0:4136:e378:8000:63bf:80ff:fffe]/", "http://[64:ff9b::a9fe:a9fe]/latest/",
])
def test_registration_refuses_private_literals(strict_server: str, project: str,
                                               url: str) -> None:
    resp = httpx.post(f"{strict_server}/api/v1/projects/{project}/webhooks", json={"url": url})
    assert resp.status_code == 422, resp.text
    body = resp.json()
    assert body["error_code"] == "webhook_target_not_allowed"
    assert "CURVECAST_WEBHOOK_ALLOW_PRIVATE" in body["message"]


def test_registration_accepts_names_and_global_addresses(strict_server: str,
                                                         project: str) -> None:
    for url in ("https://hooks.example.com/x", "http://8.8.8.8/x", "http://localhost:1/x"):
        resp = httpx.post(f"{strict_server}/api/v1/projects/{project}/webhooks",
                          json={"url": url, "enabled": False})
        assert resp.status_code == 201, (url, resp.text)


def test_a_name_resolving_to_loopback_is_not_reached_by_default(receiver: Receiver) -> None:
    url = f"http://localhost:{receiver.port}/ssrf"
    refused = send_http(url, b"{}", {"Content-Type": "application/json"}, 5.0)
    assert not refused.ok and refused.status_code is None
    assert refused.error is not None and refused.error.startswith("target not allowed")
    assert receiver.by_path("/ssrf") == []
    allowed = send_http(url, b"{}", {"Content-Type": "application/json"}, 5.0,
                        allow_private=True)
    assert allowed.ok and len(receiver.by_path("/ssrf")) == 1


@pytest.mark.parametrize("host", CARRYING_PRIVATE)
def test_ipv6_forms_of_private_ipv4_are_not_reached_at_delivery(receiver: Receiver,
                                                                host: str) -> None:
    """The delivery's own check (on the address it would connect to), for a URL registered
    before the check existed or with a name that resolves to such an address."""
    bracketed = host if host.startswith("[") else f"[{host}]"
    result = send_http(f"http://{bracketed}:{receiver.port}/carried", b"{}", {}, 5.0)
    assert not result.ok and result.status_code is None
    assert result.error is not None and result.error.startswith("target not allowed"), result
    assert receiver.by_path("/carried") == []


def test_the_ipv4_an_ipv6_address_carries() -> None:
    v4 = ipaddress.IPv4Address
    cases = {"::ffff:10.0.0.1": ["10.0.0.1"], "::7f00:1": ["127.0.0.1"],
             "64:ff9b::808:808": ["8.8.8.8"], "2002:a9fe:a9fe::1": ["169.254.169.254"],
             "2001:0:4136:e378:8000:63bf:80ff:fffe": ["65.54.227.120", "127.0.0.1"],
             "2001:4860:4860::8888": []}
    for text, expected in cases.items():
        got = carried_ipv4(ipaddress.IPv6Address(text))
        assert got == [v4(e) for e in expected], text


def test_failures_record_a_class_not_the_socket_error() -> None:
    closed = send_http(f"http://127.0.0.1:{free_port()}/x", b"{}", {}, 5.0, allow_private=True)
    assert closed.error == "connection failed"
    unknown = send_http("http://no-such-host.invalid/x", b"{}", {}, 5.0, allow_private=True)
    assert unknown.error == "name did not resolve"
    for result in (closed, unknown):
        assert "Errno" not in str(result.error) and "refused" not in str(result.error)
