"""The instance catalogue drives EFA interfaces on nodes and `vpc.amazonaws.com/efa` requests in pods."""

import pytest

from trainforge import catalog


@pytest.mark.parametrize("name, interfaces, efa_devices", [
    ("p5.48xlarge", 33, 32), ("p5e.48xlarge", 33, 32), ("p5en.48xlarge", 17, 16), ("p6-b200.48xlarge", 9, 8),
    ("p4d.24xlarge", 4, 4), ("g6.48xlarge", 2, 1),
])
def test_efa_layout_uses_every_network_card(name, interfaces, efa_devices):
    instance = catalog.lookup(name)
    layout = catalog.efa_interface_layout(instance)
    assert len(layout) == interfaces
    assert catalog.efa_device_count(instance) == efa_devices == instance.efa_interfaces
    assert layout[0].network_card_index == 0 and layout[0].device_index == 0
    assert layout[0].interface_type in ("interface", "efa")  # the primary interface must carry ENA
    assert len({(s.network_card_index, s.device_index) for s in layout}) == len(layout)


def test_efa_only_interfaces_follow_the_ec2_guide_on_multi_card_types():
    layout = catalog.efa_interface_layout(catalog.lookup("p5.48xlarge"))
    assert (layout[0].interface_type, layout[1]) == ("interface", catalog.NetworkInterfaceSlot(0, 1, "efa-only"))
    assert all(s.device_index == 0 and s.interface_type == "efa-only" for s in layout[2:])


def test_types_without_efa_only_support_get_efa_interfaces_on_every_card():
    layout = catalog.efa_interface_layout(catalog.lookup("p4d.24xlarge"))
    assert [(s.network_card_index, s.device_index, s.interface_type) for s in layout] == [(c, 0, "efa") for c in range(4)]


def test_cpu_types_are_accepted_without_a_row_and_have_no_gpus():
    assert catalog.lookup("m7i.2xlarge").gpus == 0


@pytest.mark.parametrize("name, fragment", [
    ("p5.24xlarge", "not in the GPU catalogue"), ("g4dn.xlarge", "does not support"), ("P5.48XLARGE", "not an EC2 instance type"),
])
def test_unknown_gpu_types_are_refused_rather_than_mistaken_for_cpu(name, fragment):
    with pytest.raises(catalog.UnknownInstanceType, match=fragment):
        catalog.lookup(name)


def test_a_type_without_efa_has_no_layout():
    with pytest.raises(catalog.UnknownInstanceType, match="has no EFA interfaces"):
        catalog.efa_interface_layout(catalog.lookup("g6.xlarge"))
