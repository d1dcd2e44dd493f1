import pytest

from omni_ray.errors import UserError
from omni_ray.topology.addresses import check_listen, host_addresses, is_loopback

HAVE = ["127.0.0.1", "192.0.2.2", "::1"]


def test_no_listen_means_loopback_only():
    assert check_listen(None, None, HAVE) is None


def test_an_address_of_this_host_is_taken():
    assert check_listen("192.0.2.2", None, HAVE) == "192.0.2.2"


@pytest.mark.parametrize("value, problem", [
    ("eth0", "--listen eth0: not an IP address"),
    ("0.0.0.0", "--listen 0.0.0.0: Ray needs one address of this host"),
    ("10.9.9.9", r"--listen 10.9.9.9: not an address of this host \(it has 127.0.0.1, "),
])
def test_a_bad_listen_names_the_option_and_value(value, problem):
    with pytest.raises(UserError, match=problem):
        check_listen(value, None, HAVE)


def test_listen_with_address_is_refused():
    with pytest.raises(UserError, match="--listen 192.0.2.2: only for a local Ray; with "
                                        "--address auto"):
        check_listen("192.0.2.2", "auto", HAVE)


def test_loopback_includes_mapped_and_v6():
    assert is_loopback("127.0.0.1") and is_loopback("::1") and is_loopback("::ffff:127.0.0.1")
    assert not is_loopback("0.0.0.0") and not is_loopback("::") and not is_loopback("192.0.2.2")


def test_this_host_has_loopback():
    assert "127.0.0.1" in host_addresses()
