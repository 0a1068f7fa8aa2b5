"""Refresh the price table from AWS: on-demand list prices from the Pricing API, spot from EC2 spot price history.

The result is one file per region under `$TRAINFORGE_HOME/prices/`, which overrides the shipped table for
that region (trainforge.pricing). Everything is fetched before anything is written, and the file is replaced
atomically: a failed refresh leaves the previous prices as they were.

Endpoints follow boto3's configuration, including AWS_ENDPOINT_URL_PRICING / AWS_ENDPOINT_URL_EC2 (the tests
point them at servers on loopback). IAM: pricing:GetProducts and ec2:DescribeSpotPriceHistory.
"""

from __future__ import annotations

import datetime as dt
import json
import statistics
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from trainforge import paths, pricing
from trainforge.errors import EXIT_FAILED, TrainforgeError
from trainforge.files import write_whole

PRICING_API_REGION = "us-east-1"  # one of the Pricing API's own endpoints; it serves every region's prices
SERVICE_CODE = "AmazonEC2"
# The one product per instance type and region that an EKS node is billed as: Linux, shared tenancy, no
# pre-installed software or licence, capacity actually used (not reservations).
PRODUCT_FILTERS = {"operatingSystem": "Linux", "tenancy": "Shared", "preInstalledSw": "NA", "capacitystatus": "Used",
                   "licenseModel": "No License required"}
SPOT_PRODUCT = "Linux/UNIX"


class PriceRefreshError(TrainforgeError):
    """AWS could not be asked (no credentials, access denied, unreachable): nothing was written."""

    exit_code = EXIT_FAILED

    def __init__(self, message: str):
        super().__init__("", [message])


def _filters(instance_type: str, region: str) -> list[dict[str, str]]:
    wanted = {**PRODUCT_FILTERS, "instanceType": instance_type, "regionCode": region}
    return [{"Type": "TERM_MATCH", "Field": k, "Value": v} for k, v in wanted.items()]


def hourly_on_demand_prices(product: dict[str, Any]) -> set[float]:
    """The hourly USD prices in one Pricing API product document's on-demand terms."""
    out = set()
    for term in product.get("terms", {}).get("OnDemand", {}).values():
        for dimension in term.get("priceDimensions", {}).values():
            usd = float(dimension.get("pricePerUnit", {}).get("USD", "0"))
            if dimension.get("unit") == "Hrs" and usd > 0:
                out.add(usd)
    return out


def on_demand_price(client, instance_type: str, region: str) -> float | None:
    """None when AWS does not sell the type in the region; an error when the filters leave more than one price."""
    prices: set[float] = set()
    for page in client.get_paginator("get_products").paginate(ServiceCode=SERVICE_CODE, Filters=_filters(instance_type, region),
                                                              FormatVersion="aws_v1"):
        for document in page.get("PriceList", []):
            prices |= hourly_on_demand_prices(json.loads(document) if isinstance(document, str) else document)
    if len(prices) > 1:
        raise PriceRefreshError(f"{instance_type} in {region}: the Pricing API returned {len(prices)} different on-demand prices "
                                f"{sorted(prices)} for one product filter {PRODUCT_FILTERS}; refusing to guess")
    return prices.pop() if prices else None


@dataclass(frozen=True)
class SpotSummary:
    median: float  # of the latest price in each availability zone: what a diversified spot group typically pays
    low: float
    zones: int


def summarise_spot(records: Iterable[dict[str, Any]]) -> dict[str, SpotSummary]:
    """Spot price history records -> per instance type, over the newest record of each availability zone."""
    newest: dict[tuple[str, str], dict[str, Any]] = {}
    for record in records:
        key = (record["InstanceType"], record["AvailabilityZone"])
        if key not in newest or record["Timestamp"] > newest[key]["Timestamp"]:
            newest[key] = record
    by_type: dict[str, list[float]] = {}
    for (instance_type, _), record in newest.items():
        by_type.setdefault(instance_type, []).append(float(record["SpotPrice"]))
    return {t: SpotSummary(statistics.median(p), min(p), len(p)) for t, p in by_type.items()}


def spot_prices(client, instance_types: list[str], lookback: dt.timedelta, now: dt.datetime) -> dict[str, SpotSummary]:
    pages = client.get_paginator("describe_spot_price_history").paginate(
        InstanceTypes=instance_types, ProductDescriptions=[SPOT_PRODUCT], StartTime=now - lookback, EndTime=now)
    return summarise_spot(record for page in pages for record in page.get("SpotPriceHistory", []))


@dataclass(frozen=True)
class Refresh:
    region: str
    as_of: str
    on_demand: dict[str, float]
    spot: dict[str, SpotSummary]
    not_offered: list[str]  # no on-demand product in this region

    def document(self) -> dict[str, Any]:
        return {"region": self.region, "as_of": self.as_of,
                "source": "AWS Pricing API (on-demand, Linux, shared tenancy); EC2 spot price history (median of the newest "
                          "price per availability zone)",
                "on_demand": dict(sorted(self.on_demand.items())),
                "spot": {t: round(s.median, 6) for t, s in sorted(self.spot.items())},
                "spot_low": {t: round(s.low, 6) for t, s in sorted(self.spot.items())},
                "spot_zones": {t: s.zones for t, s in sorted(self.spot.items())}}


def _clients(region: str):
    import boto3
    from botocore.config import Config

    config = Config(retries={"max_attempts": 3, "mode": "standard"}, connect_timeout=5, read_timeout=30)
    return (boto3.client("pricing", region_name=PRICING_API_REGION, config=config),
            boto3.client("ec2", region_name=region, config=config))


def fetch(region: str, instance_types: list[str], lookback: dt.timedelta = dt.timedelta(hours=24),
          on_progress: Callable[[str], None] = lambda _: None) -> Refresh:
    """Everything from AWS for one region; raises PriceRefreshError with the cause and the fix."""
    from botocore.exceptions import BotoCoreError, ClientError, NoCredentialsError

    pricing_client, ec2 = _clients(region)
    now = dt.datetime.now(dt.timezone.utc).replace(microsecond=0)
    on_demand: dict[str, float] = {}
    not_offered: list[str] = []
    try:
        for instance_type in instance_types:
            on_progress(instance_type)
            price = on_demand_price(pricing_client, instance_type, region)
            if price is None:
                not_offered.append(instance_type)
            else:
                on_demand[instance_type] = price
        on_progress("spot price history")
        spot = spot_prices(ec2, list(on_demand), lookback, now) if on_demand else {}
    except NoCredentialsError:
        raise PriceRefreshError("no AWS credentials. Fix: set AWS_PROFILE (or AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY) "
                                "for an identity allowed pricing:GetProducts and ec2:DescribeSpotPriceHistory") from None
    except ClientError as exc:
        error = exc.response.get("Error", {})
        raise PriceRefreshError(f"AWS refused {exc.operation_name}: {error.get('Code')}: {error.get('Message')}. Fix: allow "
                                "pricing:GetProducts and ec2:DescribeSpotPriceHistory, or check --region") from None
    except BotoCoreError as exc:
        raise PriceRefreshError(f"could not reach AWS: {exc}") from None
    return Refresh(region, now.isoformat().replace("+00:00", "Z"), on_demand, spot, not_offered)


def save(refresh: Refresh) -> Path:
    """Replace the region's file atomically and make the next estimate use it."""
    path = paths.refreshed_prices_file(refresh.region)
    path.parent.mkdir(parents=True, exist_ok=True)
    write_whole(path, yaml.safe_dump(refresh.document(), sort_keys=False))
    pricing.price_table.cache_clear()
    return path


def default_instance_types() -> list[str]:
    """Every type of the shipped table: the GPU types jobs use and the CPU types of the system node groups."""
    return list(pricing.price_table().on_demand)
