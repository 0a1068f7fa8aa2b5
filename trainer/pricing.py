"""What a job costs: a dated price table shipped with the project, and the estimate the submitter checks."""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Literal

import yaml

PRICES = Path(__file__).with_name("prices.yaml")
Capacity = Literal["on-demand", "spot", "spot-fallback"]


class PriceUnknown(LookupError):
    pass


@dataclass(frozen=True)
class PriceTable:
    as_of: str
    regions: tuple[str, ...]
    on_demand: dict[str, float]
    spot_fraction: dict[str, float]

    def hourly(self, instance_type: str, capacity: Literal["on-demand", "spot"], region: str) -> float:
        if region not in self.regions:
            raise PriceUnknown(f"no prices for region {region!r} (the table covers {list(self.regions)}, as of {self.as_of})")
        if instance_type not in self.on_demand:
            raise PriceUnknown(f"no price for {instance_type!r} in the table of {self.as_of}; add it to trainer/prices.yaml")
        price = self.on_demand[instance_type]
        if capacity == "spot":
            family = instance_type.split(".", 1)[0]
            price *= self.spot_fraction.get(family, self.spot_fraction["default"])
        return price


@lru_cache(maxsize=1)
def price_table(path: Path = PRICES) -> PriceTable:
    raw = yaml.safe_load(path.read_text())
    return PriceTable(str(raw["as_of"]), tuple(raw["regions"]), dict(raw["on_demand"]), dict(raw["spot_fraction"]))


@dataclass(frozen=True)
class CostEstimate:
    instance_type: str
    nodes: int
    hours: float
    on_demand_hourly: float  # per node
    spot_hourly: float  # per node
    capacity: Capacity
    as_of: str

    @property
    def expected_usd(self) -> float:
        """What the submitter holds against limits: spot-fallback is priced at on-demand, the worst case."""
        per_node = self.spot_hourly if self.capacity == "spot" else self.on_demand_hourly
        return self.nodes * per_node * self.hours

    @property
    def on_demand_usd(self) -> float:
        return self.nodes * self.on_demand_hourly * self.hours

    @property
    def spot_usd(self) -> float:
        return self.nodes * self.spot_hourly * self.hours


def estimate(instance_type: str, nodes: int, hours: float, capacity: Capacity, region: str) -> CostEstimate:
    table = price_table()
    return CostEstimate(instance_type, nodes, hours, table.hourly(instance_type, "on-demand", region),
                        table.hourly(instance_type, "spot", region), capacity, table.as_of)
