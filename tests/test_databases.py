"""MLflow's own database role and the teams' sweep roles, on a real PostgreSQL (Debian's, on loopback), set up as RDS
sets up an instance: a master user that is no superuser (CREATEDB, CREATEROLE) owning the initial database `mlflow`
and `postgres`. The SQL is the program's, run by the command and environment of the program's own Jobs (only the
host, the port and TLS changed: the loopback server has no certificate).

- MLflow signs in as `mlflow_server`, which owns its two databases and everything in them — also on an instance where
  an earlier release ran MLflow as the master user and so created its tables as master;
- a team's sweep role can connect to none of `mlflow`, `mlflow_auth`, `postgres`, nor to another team's database;
  MLflow's role cannot connect to a team's;
- the scripts can run again (every `pulumi up` whose SQL changed does), and a new password in the Secret is taken.
"""

from __future__ import annotations

import os
import subprocess

import pytest
from support.repo import STACKS
from support.servers import postgres_binaries, postgres_server

from trainforge import contract
from trainforge.platform.manifests import sweeps, tracking
from trainforge.stackconfig import load_stack_file

psycopg2 = pytest.importorskip("psycopg2")
if postgres_binaries() is None or not subprocess.run(["which", "psql"], capture_output=True).stdout:
    pytest.skip("no PostgreSQL server programs: Debian's `postgresql` package (scripts/bootstrap installs it with `dev`)",
                allow_module_level=True)

if os.geteuid() == 0:
    import pwd
    try:
        pwd.getpwnam("postgres")
    except KeyError:
        pytest.skip("running as root and no `postgres` user to run the server as (Debian's package creates it)", allow_module_level=True)

MASTER, MASTER_PASSWORD = "mlflow", "master-password"  # infra/database.py's master user
MASTER_SECRET = "mlflow-database"
CFG = load_stack_file(STACKS / "Pulumi.dev.yaml")
TEAMS = CFG.teams[:2]

pytestmark = pytest.mark.slow  # a real server per test


class Instance:
    """A PostgreSQL server set up like a new RDS instance of the stack."""

    def __init__(self, port: int, superuser: tuple[str, str], tmp):
        self.port, self.tmp = port, tmp
        self.secrets = {(MASTER_SECRET, "username"): MASTER, (MASTER_SECRET, "password"): MASTER_PASSWORD,
                        (tracking.SERVER_SECRET, "password"): "server-password-1"}
        for team in TEAMS:
            self.secrets[(f"trainforge-sweeps-{team.name}", "password")] = f"sweeps-{team.name}-password"
        self.execute(superuser, "postgres", f"CREATE ROLE {MASTER} LOGIN CREATEDB CREATEROLE PASSWORD '{MASTER_PASSWORD}'",
                     f"CREATE DATABASE {contract.MLFLOW_DATABASE} OWNER {MASTER}", f"ALTER DATABASE postgres OWNER TO {MASTER}")

    def execute(self, user: tuple[str, str], database: str, *statements: str) -> None:
        conn = self.connect(*user, database)
        conn.autocommit = True  # CREATE DATABASE runs outside a transaction
        for statement in statements:
            conn.cursor().execute(statement)
        conn.close()

    def url(self, user: str, password: str, database: str) -> str:
        return f"postgresql+psycopg2://{user}:{password}@127.0.0.1:{self.port}/{database}"

    def connect(self, user: str, password: str, database: str):
        return psycopg2.connect(host="127.0.0.1", port=self.port, user=user, password=password, dbname=database)

    def can_connect(self, user: str, password: str, database: str) -> bool:
        try:
            self.connect(user, password, database).close()
            return True
        except psycopg2.OperationalError as exc:
            assert "permission denied for database" in str(exc) or "password authentication failed" in str(exc), exc
            return False

    def run_job(self, job: dict, config_map: dict) -> subprocess.CompletedProcess:
        """The Job's container command with its environment (Secrets resolved), its ConfigMap as files."""
        (container,) = job["spec"]["template"]["spec"]["containers"]
        scripts = self.tmp / config_map["metadata"]["name"]
        scripts.mkdir(exist_ok=True)
        for name, text in config_map["data"].items():
            (scripts / name).write_text(text)
        env = {}
        for var in container["env"]:
            ref = (var.get("valueFrom") or {}).get("secretKeyRef")
            env[var["name"]] = self.secrets[(ref["name"], ref["key"])] if ref else var["value"]
        assert env["PGSSLMODE"] == "require"  # RDS: TLS
        env |= {"PGHOST": "127.0.0.1", "PGPORT": str(self.port), "PGSSLMODE": "disable"}
        command = [part.replace("/sql/", f"{scripts}/") for part in container["command"]]
        result = subprocess.run(command, env={"PATH": os.environ["PATH"], **env}, capture_output=True, text=True, timeout=60)
        assert result.returncode == 0, result.stderr
        return result

    def run_mlflow_bootstrap(self) -> None:
        config_map, job = tracking.database_objects(host="rds.internal", master_secret=MASTER_SECRET)
        self.run_job(job, config_map)

    def run_sweeps_bootstrap(self) -> None:
        for team in TEAMS:
            self.run_job(sweeps.database_job(CFG, team, host="rds.internal", master_secret=MASTER_SECRET), sweeps.sql_config_map(CFG, team))

    def server(self) -> tuple[str, str]:
        return tracking.SERVER_ROLE, self.secrets[(tracking.SERVER_SECRET, "password")]

    def owners(self, database: str, as_user: tuple[str, str] | None = None) -> set[str]:
        """Who owns what is in `public`: relations and enum types."""
        with self.connect(*(as_user or self.server()), database) as conn:
            cur = conn.cursor()
            cur.execute("SELECT DISTINCT pg_get_userbyid(c.relowner) FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace "
                        "WHERE n.nspname = 'public' AND c.relkind IN ('r', 'p', 'v', 'm', 'f', 'S') "
                        "UNION SELECT DISTINCT pg_get_userbyid(t.typowner) FROM pg_type t JOIN pg_namespace n ON n.oid = t.typnamespace "
                        "WHERE n.nspname = 'public' AND t.typtype = 'e'")
            owners = {row[0] for row in cur.fetchall()}
        conn.close()
        return owners


@pytest.fixture
def instance(tmp_path):
    with postgres_server(tmp_path) as (port, superuser, password):
        yield Instance(port, (superuser, password), tmp_path)


def mlflow_migrates_and_writes(instance: Instance, user: str, password: str) -> None:
    """What the chart's migration init container and the server do at start: migrate both stores; then a write."""
    from mlflow.server.auth.sqlalchemy_store import SqlAlchemyStore as AuthStore
    from mlflow.store.tracking.sqlalchemy_store import SqlAlchemyStore

    store = SqlAlchemyStore(instance.url(user, password, contract.MLFLOW_DATABASE), str(instance.tmp / "artifacts"))
    experiment = store.create_experiment(f"vision/probe-{user}")
    store.create_run(experiment, user_id="team-vision", start_time=0, tags=[], run_name="probe")
    store.engine.dispose()
    auth = AuthStore()
    auth.init_db(instance.url(user, password, tracking.AUTH_DATABASE))
    auth.create_user(f"probe-{user}", "probe-password-123")
    auth.engine.dispose()


def test_a_new_instance_gives_mlflow_its_own_role_owning_both_databases(instance):
    instance.run_sweeps_bootstrap()
    instance.run_mlflow_bootstrap()
    mlflow_migrates_and_writes(instance, *instance.server())
    for database in (contract.MLFLOW_DATABASE, tracking.AUTH_DATABASE):
        assert instance.owners(database) == {tracking.SERVER_ROLE}


def test_an_instance_where_mlflow_ran_as_master_is_handed_over(instance):
    """The release before this one: MLflow migrated and wrote as the master user, the auth database made as master."""
    instance.execute((MASTER, MASTER_PASSWORD), "postgres", f"CREATE DATABASE {tracking.AUTH_DATABASE}")
    mlflow_migrates_and_writes(instance, MASTER, MASTER_PASSWORD)
    for database in (contract.MLFLOW_DATABASE, tracking.AUTH_DATABASE):
        assert instance.owners(database, as_user=(MASTER, MASTER_PASSWORD)) == {MASTER}
    instance.run_sweeps_bootstrap()
    instance.run_mlflow_bootstrap()
    for database in (contract.MLFLOW_DATABASE, tracking.AUTH_DATABASE):
        assert instance.owners(database) == {tracking.SERVER_ROLE}, database
    # The server goes on where the master user left off: its data is there, and it can migrate and write.
    from mlflow.store.tracking.sqlalchemy_store import SqlAlchemyStore
    store = SqlAlchemyStore(instance.url(*instance.server(), contract.MLFLOW_DATABASE), str(instance.tmp / "artifacts"))
    assert store.get_experiment_by_name(f"vision/probe-{MASTER}") is not None
    store.engine.dispose()
    mlflow_migrates_and_writes(instance, *instance.server())


def test_no_team_reaches_mlflows_databases_and_mlflow_reaches_no_teams(instance):
    instance.run_sweeps_bootstrap()
    instance.run_mlflow_bootstrap()
    mlflow_migrates_and_writes(instance, *instance.server())
    databases = {team.name: contract.sweep_database(team.name) for team in TEAMS}
    for team in TEAMS:
        database, role = databases[team.name]
        password = instance.secrets[(f"trainforge-sweeps-{team.name}", "password")]
        assert instance.can_connect(role, password, database), "a team reaches its own study database"
        for closed in (*tracking.CLOSED_DATABASES, *(d for name, (d, _) in databases.items() if name != team.name)):
            assert not instance.can_connect(role, password, closed), f"{role} reaches {closed}"
        assert not instance.can_connect(*instance.server(), database), f"MLflow's role reaches {database}"
    with instance.connect(MASTER, MASTER_PASSWORD, "postgres") as conn:
        cur = conn.cursor()
        cur.execute("SELECT rolsuper, rolcreaterole, rolcreatedb FROM pg_roles WHERE rolname = %s", (tracking.SERVER_ROLE,))
        assert cur.fetchone() == (False, False, False), "MLflow's role can create nothing beyond its databases"
        cur.execute("SELECT count(*) FROM pg_auth_members m JOIN pg_roles r ON r.oid = m.roleid JOIN pg_roles u ON u.oid = m.member "
                    "WHERE u.rolname = %s", (tracking.SERVER_ROLE,))
        assert cur.fetchone() == (0,), "MLflow's role belongs to no other role (no team's sweep role)"
    conn.close()


def test_the_bootstrap_runs_again_and_takes_a_new_password(instance):
    instance.run_sweeps_bootstrap()
    instance.run_mlflow_bootstrap()
    mlflow_migrates_and_writes(instance, *instance.server())
    old = instance.server()
    instance.secrets[(tracking.SERVER_SECRET, "password")] = "server-password-2"
    instance.run_mlflow_bootstrap()
    instance.run_sweeps_bootstrap()
    assert not instance.can_connect(*old, contract.MLFLOW_DATABASE)
    assert instance.can_connect(*instance.server(), contract.MLFLOW_DATABASE)
    for database in (contract.MLFLOW_DATABASE, tracking.AUTH_DATABASE):
        assert instance.owners(database) == {tracking.SERVER_ROLE}


def test_the_chart_signs_in_as_mlflows_role_and_only_bootstrap_jobs_hold_the_master_secret():
    from trainforge.platform.manifests import values
    chart = values.mlflow(CFG, database_host="rds.internal", database_secret=tracking.SERVER_SECRET, artifacts_bucket="b",
                          role_arn="arn", flask_secret_key="k", image=values.chart_image("registry.local/runtime:v1"))
    assert chart["backendStore"]["existingDatabaseSecret"]["name"] == tracking.SERVER_SECRET
    assert chart["auth"]["postgres"]["existingSecret"]["name"] == tracking.SERVER_SECRET
    assert MASTER_SECRET not in str(chart)
    assert tracking.server_secret("x")["stringData"]["username"] == tracking.SERVER_ROLE
