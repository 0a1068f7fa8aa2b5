"""`trainforge prices refresh`: on-demand prices from the AWS Pricing API and spot from EC2 spot price history,
against servers on loopback (moto's EC2; a Price List API stand-in, as moto has none), and what a refresh
changes: the region's estimates, and nothing at all when it fails."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from support.repo import REPO
from support.servers import PricingAPI, ec2_product, free_port, moto_server

from trainforge.trainer.price_refresh import summarise_spot


def cli(*argv: str, env: dict) -> subprocess.CompletedProcess:
    """`env` whole, not over this process's: the AWS settings it leaves out must stay out."""
    import subprocess as sp
    return sp.run([sys.executable, "-m", "trainforge.trainer.cli", *argv], capture_output=True, text=True, cwd=REPO, env=env, timeout=120)


@pytest.fixture
def aws_env(tmp_path):
    """Loopback-only AWS settings: fake keys, no profile, and no instance-metadata lookups (169.254.169.254)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    env.update(TRAINFORGE_HOME=str(tmp_path / "home"), AWS_ACCESS_KEY_ID="testing", AWS_SECRET_ACCESS_KEY="testing",
               AWS_EC2_METADATA_DISABLED="true", AWS_CONFIG_FILE=str(tmp_path / "none"), AWS_SHARED_CREDENTIALS_FILE=str(tmp_path / "none"))
    return env


PRODUCTS = [
    ec2_product("g6.xlarge", "us-east-1", 0.9123),
    ec2_product("g6.xlarge", "us-east-1", 0.9123, usagetype="USE1-BoxUsage:g6.xlarge:dup"),  # a second SKU, same price: page 2
    ec2_product("g6.xlarge", "us-east-1", 1.7000, operatingSystem="Windows"),  # filtered out by the Linux filter
    ec2_product("g6.xlarge", "us-west-2", 0.8500),  # another region
    ec2_product("p5.48xlarge", "us-east-1", 49.25),
]


def prices(env, region="us-east-1") -> dict:
    out = cli("prices", "show", "--region", region, "-o", "json", env=env)
    assert out.returncode == 0, out.stderr
    return {row["instance_type"]: row for row in json.loads(out.stdout)["prices"]}


@pytest.mark.slow
def test_a_refresh_overrides_the_shipped_table_for_its_region(tmp_path, aws_env):
    with PricingAPI(PRODUCTS) as pricing_api, moto_server(tmp_path) as moto:
        env = {**aws_env, "AWS_ENDPOINT_URL_PRICING": pricing_api.url, "AWS_ENDPOINT_URL_EC2": moto}
        shipped = prices(env)
        out = cli("prices", "refresh", "--region", "us-east-1", "--instance-type", "g6.xlarge", "--instance-type", "p5.48xlarge",
                  "--instance-type", "g6.2xlarge", env=env)
        assert out.returncode == 0, out.stderr
        assert "not offered in us-east-1" in out.stdout and "g6.2xlarge" in out.stdout
        # Every query carried the product filters, and the client followed the price list's pages.
        assert all({"Field": "operatingSystem", "Type": "TERM_MATCH", "Value": "Linux"} in r["Filters"] for r in pricing_api.requests)
        assert any(r.get("NextToken") for r in pricing_api.requests)
    saved = (tmp_path / "home" / "prices" / "us-east-1.yaml").read_text()
    assert "0.9123" in saved and "g6.2xlarge" not in saved
    fresh = prices(env)
    assert fresh["g6.xlarge"]["on_demand_usd_per_hour"] == 0.9123 and fresh["g6.xlarge"]["source"] == "refreshed"
    assert fresh["p5.48xlarge"]["on_demand_usd_per_hour"] == 49.25
    assert 0 < fresh["g6.xlarge"]["spot_usd_per_hour"] <= 0.9123  # moto's spot history for the type, not the typical fraction
    assert fresh["g5.xlarge"] == shipped["g5.xlarge"], "types not refreshed keep the shipped price"
    assert prices(env, "us-west-2")["g6.xlarge"]["source"] == "shipped table", "a refresh covers only its own region"
    # The submitter's estimate uses the refreshed price in the stack's region (prod: us-east-1), and says so;
    # dev runs in us-west-2, which this refresh did not cover.
    def priced_as_of(stack):
        return json.loads(cli("check", "examples/quickstart.yaml", "--stack", stack, "-o", "json", env=env).stdout)["prices_as_of"]
    assert priced_as_of("stacks/Pulumi.prod.yaml") == fresh["g6.xlarge"]["as_of"] != shipped["g6.xlarge"]["as_of"]
    assert priced_as_of("stacks/Pulumi.dev.yaml") == shipped["g6.xlarge"]["as_of"]


@pytest.mark.slow
def test_conflicting_prices_are_refused_and_the_previous_prices_kept(tmp_path, aws_env):
    with PricingAPI(PRODUCTS) as pricing_api, moto_server(tmp_path) as moto:
        env = {**aws_env, "AWS_ENDPOINT_URL_PRICING": pricing_api.url, "AWS_ENDPOINT_URL_EC2": moto}
        assert cli("prices", "refresh", "--instance-type", "g6.xlarge", env=env).returncode == 0
        saved = (tmp_path / "home" / "prices" / "us-east-1.yaml").read_bytes()
        pricing_api.products = [*PRODUCTS, ec2_product("g6.xlarge", "us-east-1", 0.5, usagetype="USE1-Other")]
        out = cli("prices", "refresh", "--instance-type", "g6.xlarge", env=env)
    assert out.returncode == 1
    assert "g6.xlarge" in out.stderr and "different on-demand prices" in out.stderr and "Nothing was changed" in out.stderr
    assert (tmp_path / "home" / "prices" / "us-east-1.yaml").read_bytes() == saved


def test_an_unreachable_endpoint_fails_clearly_and_writes_nothing(tmp_path, aws_env):
    env = {**aws_env, "AWS_ENDPOINT_URL_PRICING": f"http://127.0.0.1:{free_port()}", "AWS_ENDPOINT_URL_EC2": f"http://127.0.0.1:{free_port()}"}
    out = cli("prices", "refresh", "--instance-type", "g6.xlarge", env=env)
    assert out.returncode == 1 and "could not reach AWS" in out.stderr
    assert not (tmp_path / "home" / "prices").exists()


def test_missing_credentials_name_the_fix(tmp_path, aws_env):
    env = {k: v for k, v in aws_env.items() if k not in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY")}
    env["AWS_ENDPOINT_URL_PRICING"] = f"http://127.0.0.1:{free_port()}"
    out = cli("prices", "refresh", "--instance-type", "g6.xlarge", env=env)
    assert out.returncode == 1 and "no AWS credentials" in out.stderr and "AWS_PROFILE" in out.stderr and "Traceback" not in out.stderr


def test_spot_is_the_median_of_the_newest_price_in_each_zone():
    records = [
        {"InstanceType": "g6.xlarge", "AvailabilityZone": "us-east-1a", "SpotPrice": "0.90", "Timestamp": "2026-11-21T00:00:00Z"},
        {"InstanceType": "g6.xlarge", "AvailabilityZone": "us-east-1a", "SpotPrice": "0.30", "Timestamp": "2026-11-22T00:00:00Z"},
        {"InstanceType": "g6.xlarge", "AvailabilityZone": "us-east-1b", "SpotPrice": "0.40", "Timestamp": "2026-11-22T01:00:00Z"},
        {"InstanceType": "g6.xlarge", "AvailabilityZone": "us-east-1c", "SpotPrice": "0.35", "Timestamp": "2026-11-20T00:00:00Z"},
        {"InstanceType": "p5.48xlarge", "AvailabilityZone": "us-east-1a", "SpotPrice": "30.0", "Timestamp": "2026-11-22T00:00:00Z"},
    ]
    summary = summarise_spot(records)
    assert summary["g6.xlarge"].median == pytest.approx(0.35) and summary["g6.xlarge"].low == pytest.approx(0.30)
    assert summary["g6.xlarge"].zones == 3 and summary["p5.48xlarge"].median == 30.0


@pytest.mark.skipif(not os.environ.get("AWS_PROFILE"), reason="no AWS account: set AWS_PROFILE to refresh prices from the real AWS APIs")
def test_real_aws_prices_are_plausible(tmp_path):
    env = {**os.environ, "TRAINFORGE_HOME": str(tmp_path)}
    assert cli("prices", "refresh", "--region", "us-east-1", "--instance-type", "g6.xlarge", env=env).returncode == 0
    row = prices(env)["g6.xlarge"]
    assert 0.1 < row["on_demand_usd_per_hour"] < 10 and 0 < row["spot_usd_per_hour"] <= row["on_demand_usd_per_hour"]
