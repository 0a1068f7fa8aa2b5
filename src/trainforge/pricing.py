"""What an instance-hour costs: a dated price table shipped with the project (prices.yaml, package data),
overridden per region by `trainforge prices refresh` (trainer/price_refresh.py), and the estimate the submitter
checks. In the core because the submitter and the offline plan both price things."""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Literal

import yaml

from trainforge import paths
from trainforge.errors import TrainforgeError

PRICES = Path(__file__).with_name("prices.yaml")
Capacity = Literal["on-demand", "spot", "spot-fallback"]


class PriceUnknown(TrainforgeError):
    """No price for an instance type in a region: never guessed, never zero."""

    def __init__(self, message: str):
        super().__init__("", [message])


@dataclass(frozen=True)
class RefreshedPrices:
    """One region's prices as fetched from AWS (on-demand list price; spot: median of the latest price per AZ)."""
    region: str
    as_of: str
    source: str
    on_demand: dict[str, float]
    spot: dict[str, float]

    @classmethod
    def load(cls, path: Path) -> RefreshedPrices:
        """A file `trainforge prices refresh` wrote; a damaged or hand-edited one is refused with the file and the fix,
        never half-used (a wrong price would misstate every quote and budget check)."""
        from trainforge import yamlfile

        def refused(why: str) -> TrainforgeError:
            again = "run `trainforge prices refresh` again, or delete the file to use the shipped prices"
            return TrainforgeError("", f"{path}: {why.rstrip('.')}. Or {again}" if "Fix:" in why else f"{path}: {why}. Fix: {again}")
        try:
            raw = yamlfile.read(path)
        except (OSError, UnicodeDecodeError, yaml.YAMLError) as exc:
            raise refused(yamlfile.describe(exc)) from None
        if not isinstance(raw, dict) or not all(isinstance(raw.get(k), (str, int, float)) and not isinstance(raw.get(k), bool)
                                                for k in ("region", "as_of", "source")):
            raise refused("not a refreshed price file (it needs region, as_of and source)")
        tables = {}
        for kind in ("on_demand", "spot"):
            table = raw.get(kind) or {}
            if not isinstance(table, dict) or not all(isinstance(k, str) and isinstance(v, (int, float)) and not isinstance(v, bool)
                                                      and 0 < v < 10_000 for k, v in table.items()):
                raise refused(f"{kind} is not a table of instance types and hourly prices between 0 and 10,000 USD")
            tables[kind] = {k: float(v) for k, v in table.items()}
        return cls(str(raw["region"]), str(raw["as_of"]), str(raw["source"]), tables["on_demand"], tables["spot"])


@dataclass(frozen=True)
class Quote:
    on_demand: float  # USD per node-hour
    spot: float
    as_of: str
    refreshed: bool  # from a refresh, not the shipped table

    def hourly(self, capacity: str) -> float:
        """The price a node of this capacity is charged: spot at the spot price; on-demand, and spot-fallback as
        submitted (it may land on on-demand: the worst case), at on-demand."""
        return self.spot if capacity == "spot" else self.on_demand


@dataclass(frozen=True)
class PriceTable:
    as_of: str
    regions: tuple[str, ...]
    on_demand: dict[str, float]
    spot_fraction: dict[str, float]
    refreshed: dict[str, RefreshedPrices] = field(default_factory=dict)  # by region

    def typical_spot(self, instance_type: str, on_demand: float) -> float:
        family = instance_type.split(".", 1)[0]
        return on_demand * self.spot_fraction.get(family, self.spot_fraction["default"])

    def _shipped_on_demand(self, instance_type: str, region: str) -> float:
        if region not in self.regions:
            raise PriceUnknown(f"no prices for region {region!r} (the table covers {list(self.regions)}, as of {self.as_of}). "
                               f"Fix: `trainforge prices refresh --region {region}`")
        if instance_type not in self.on_demand:
            raise PriceUnknown(f"no price for {instance_type!r} in the table of {self.as_of}. "
                               f"Fix: `trainforge prices refresh --region {region} --instance-type {instance_type}`, or add it to src/trainforge/prices.yaml")
        return self.on_demand[instance_type]

    def quote(self, instance_type: str, region: str) -> Quote:
        """A refreshed price where there is one for this region and type, else the shipped table's."""
        fresh = self.refreshed.get(region)
        on_demand = fresh.on_demand.get(instance_type) if fresh else None
        spot = fresh.spot.get(instance_type) if fresh else None
        used_fresh = on_demand is not None or spot is not None
        if on_demand is None:
            on_demand = self._shipped_on_demand(instance_type, region)
        if spot is None:
            spot = self.typical_spot(instance_type, on_demand)
        return Quote(on_demand, spot, fresh.as_of if fresh and used_fresh else self.as_of, used_fresh)

    def hourly(self, instance_type: str, capacity: str, region: str) -> float:
        return self.quote(instance_type, region).hourly(capacity)


@lru_cache(maxsize=1)
def price_table(path: Path = PRICES) -> PriceTable:
    raw = yaml.safe_load(path.read_text())
    directory = paths.refreshed_prices_dir()
    refreshed = {r.region: r for r in (RefreshedPrices.load(p) for p in sorted(directory.glob("*.yaml")))} if directory.exists() else {}
    return PriceTable(str(raw["as_of"]), tuple(raw["regions"]), dict(raw["on_demand"]), dict(raw["spot_fraction"]), refreshed)


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
    quote = price_table().quote(instance_type, region)
    return CostEstimate(instance_type, nodes, hours, quote.on_demand, quote.spot, capacity, quote.as_of)


def region_prices(region: str) -> list[dict]:
    """Per instance type in `region`: on-demand and spot USD per hour, the discount, and where each number comes from."""
    table = price_table()
    fresh = table.refreshed.get(region)
    rows = []
    for name in sorted(set(table.on_demand) | set(fresh.on_demand if fresh else ())):
        try:
            quote = table.quote(name, region)
        except PriceUnknown:
            continue
        rows.append({"instance_type": name, "on_demand_usd_per_hour": quote.on_demand, "spot_usd_per_hour": round(quote.spot, 6),
                     "spot_discount": round(1 - quote.spot / quote.on_demand, 3), "as_of": quote.as_of,
                     "source": "refreshed" if quote.refreshed else "shipped table"})
    return rows


SERVICE_PRICES = Path(__file__).with_name("service_prices.yaml")


@lru_cache(maxsize=1)
def service_prices(path: Path = SERVICE_PRICES) -> dict:
    """The dated table of service prices (EKS, NAT, EBS, FSx, S3, RDS, KMS, ECR, load balancers) `trainforge plan`
    prices a stack with; `$TRAINFORGE_HOME/prices/services.yaml` overrides keys of it."""
    table = yaml.safe_load(path.read_text())
    override = paths.refreshed_prices_dir() / "services.yaml"
    if override.exists():
        table = {**table, **(yaml.safe_load(override.read_text()) or {})}
    return table
