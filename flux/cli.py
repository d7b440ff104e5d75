"""The ``flux`` command: serve a broker, publish, subscribe, inspect, simulate.

Each subcommand is a thin layer over the library: ``serve`` over
``flux.router.main``, ``pub``/``sub``/``stats`` over ``flux.client.trio``, ``sim``
over ``flux.sim``. Errors a user can fix are printed in one line, without a traceback.
"""

from __future__ import annotations

import os
import sys
from typing import Any

import click

from flux import errors

DEFAULT_URL = "flux://127.0.0.1:7070"


def credential_options(fn: Any) -> Any:
    """--token, --user, --password (or FLUX_TOKEN, FLUX_USER, FLUX_PASSWORD): who the
    client is when the broker has auth on (G13)."""
    fn = click.option("--password", envvar="FLUX_PASSWORD", default=None,
                      help="Password of --user (prefer FLUX_PASSWORD: flags show in ps).")(fn)
    fn = click.option("--user", envvar="FLUX_USER", default=None,
                      help="User to log in as, with --password.  [env: FLUX_USER]")(fn)
    fn = click.option("--token", envvar="FLUX_TOKEN", default=None,
                      help="Token to authenticate with.  [env: FLUX_TOKEN]")(fn)
    fn = click.option("--tls-ca", envvar="FLUX_TLS_CA", default=None,
                      help="Speak TLS, trusting this CA file (a flux+tls:// URL uses the"
                           " system's CAs).  [env: FLUX_TLS_CA]")(fn)
    fn = click.option("--tls-cert", envvar="FLUX_TLS_CERT", default=None,
                      help="Client certificate (PEM) for mutual TLS.  [env: FLUX_TLS_CERT]")(fn)
    return click.option("--tls-key", envvar="FLUX_TLS_KEY", default=None,
                        help="Key of --tls-cert, if not in its file.  [env: FLUX_TLS_KEY]")(fn)


def _tls(url: str, ca: str | None, cert: str | None, key: str | None) -> Any:
    from flux.client.tls import client_context

    try:
        return client_context(url, None, ca=ca, cert=cert, key=key)
    except (OSError, ValueError) as exc:
        raise click.ClickException(f"TLS: {exc}") from None


@click.group(context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.version_option(package_name="flux")
def main() -> None:
    """Flux: an in-memory event streaming broker.

    \b
    Start a broker, then publish and subscribe from another terminal:
      flux serve                          # router on 127.0.0.1:7070, one shard per CPU
      flux pub orders.eu 'hello'          # prints the offset it was stored at
      flux sub orders.eu --read-old       # prints messages as they arrive
      flux stats                          # topics, subscriptions and their lag
      flux top                            # the same, live: rates and lag (q quits)
      flux dlq list orders.eu             # dead letters of each subscription (G11)
    """


@main.command()
@click.option("-c", "--config", "config_path", type=click.Path(dir_okay=False),
              help="YAML config file (see README, 'Configuration').")
@click.option("--host", default=None, help="Address to listen on.  [default: 127.0.0.1]")
@click.option("--port", type=int, default=None,
              help="The router's public port; 0 picks a free one.  [default: 7070]")
@click.option("--shards", default=None, help="Shard processes: a number or 'auto' (one per CPU).")
@click.option("--data-dir", type=click.Path(file_okay=False), default=None,
              help="Keep topics on disk in this directory (storage.dir); every topic a"
                   " policy does not place elsewhere becomes a disk topic.")
@click.option("--set", "overrides", multiple=True, metavar="KEY=VALUE",
              help="Set any config key, e.g. --set message.ttl=5 (repeatable).")
def serve(config_path: str | None, host: str | None, port: int | None, shards: str | None,
          data_dir: str | None, overrides: tuple[str, ...]) -> None:
    """Run a broker: the router plus one shard process per CPU.

    Flags override --set, which overrides the config file. Ctrl-C (or SIGTERM)
    drains and stops every shard before the router exits.
    """
    from flux import config as config_mod

    shard_flag: int | str | None = shards
    if shards is not None and shards != "auto":
        if not shards.isdigit():
            raise click.BadParameter("expected a number or 'auto'", param_hint="--shards")
        shard_flag = int(shards)
    storage: dict[str, str | None] = {"storage.dir": None, "storage.kind": None}
    if data_dir is not None:
        storage = {"storage.dir": os.path.abspath(data_dir), "storage.kind": "disk"}

    def load() -> config_mod.Config:  # again on SIGHUP (its auth section is reloaded)
        return config_mod.load(config_path, list(overrides), host=host, port=port,
                               shards=shard_flag, **storage)

    try:
        cfg = load()
        from flux.tls import server_context

        server_context(cfg.tls)  # a certificate that does not load stops nothing running
    except errors.ConfigError as exc:
        raise click.ClickException(str(exc)) from None
    from flux.router.main import serve_forever

    sys.exit(serve_forever(cfg, load))


@main.command()
@click.argument("topic")
@click.argument("payload", required=False)
@click.option("--url", default=DEFAULT_URL, show_default=True, help="The router's address.")
@click.option("--id", "message_id", default=None,
              help="Message id for dedup (default: a random id, reused on retries).")
@click.option("--lines", is_flag=True,
              help="With '-' or no PAYLOAD: publish each line of stdin as its own message.")
@click.option("--key", default=None, help="The message key (1-255 bytes).")
@click.option("--header", "headers", multiple=True, metavar="NAME=VALUE",
              help="A message header (repeatable; names beginning 'flux-' are reserved).")
@click.option("--delay", type=float, default=None,
              help="Seconds before the message is due: stored now, pushed to no one before.")
@credential_options
def pub(topic: str, payload: str | None, url: str, message_id: str | None, lines: bool,
        key: str | None, headers: tuple[str, ...], delay: float | None,
        token: str | None, user: str | None,
        password: str | None, tls_ca: str | None, tls_cert: str | None,
        tls_key: str | None) -> None:
    """Publish PAYLOAD (or stdin, with '-' or no PAYLOAD) to TOPIC.

    Prints the offset, generation, whether it was a duplicate and, for a delayed
    message, when it is due.
    """

    from flux.client.trio import connect

    if payload is None or payload == "-":
        data = sys.stdin.buffer.read()
        bodies = data.splitlines() if lines else [data]
    else:
        bodies = [os.fsencode(payload)]  # the bytes given, even if they are not UTF-8
        if lines:
            raise click.UsageError("--lines reads stdin; pass '-' or no PAYLOAD")
    if message_id is not None and len(bodies) != 1:
        raise click.UsageError("--id applies to one message; drop it with --lines")
    header_map: dict[str, str] = {}
    for item in headers:
        name, sep, value = item.partition("=")
        if not sep:
            raise click.UsageError(f"--header {item!r}: expected NAME=VALUE")
        header_map[name] = value

    async def run() -> None:
        async with connect(url, token=token, user=user, password=password,
                           tls=_tls(url, tls_ca, tls_cert, tls_key)) as client:
            for body in bodies:
                ack = await client.publish(topic, body, id=message_id, key=key,
                                           headers=header_map or None, delay=delay)
                dup = " (duplicate)" if ack.duplicate else ""
                due = f" due={ack.due:.3f}" if ack.due is not None else ""
                click.echo(f"{topic} offset={ack.offset} generation={ack.generation:#x}"
                           f"{dup}{due}")

    _run(run)


@main.command()
@click.argument("topic")
@click.option("--url", default=DEFAULT_URL, show_default=True, help="The router's address.")
@click.option("--name", default=None,
              help="Subscription name: a durable cursor that survives reconnects.")
@click.option("--read-old", is_flag=True, help="Start at the oldest message held (first use only).")
@click.option("--from-offset", type=int, default=None, help="Start at this offset (first use only).")
@click.option("--count", type=int, default=None, help="Exit after this many messages.")
@click.option("--no-ack", is_flag=True, help="Do not ack (messages will be redelivered).")
@click.option("--shared", is_flag=True,
              help="Join the subscription --name as one worker of a pool (each message goes"
                   " to one worker).")
@click.option("--key-ordered", is_flag=True,
              help="With --shared: keep each message key on one worker while it has unacked"
                   " messages.")
@click.option("--max-in-flight", type=int, default=None,
              help="Most unacked messages this subscriber holds at once.")
@credential_options
def sub(topic: str, url: str, name: str | None, read_old: bool, from_offset: int | None,
        count: int | None, no_ack: bool, shared: bool, key_ordered: bool,
        max_in_flight: int | None, token: str | None, user: str | None,
        password: str | None, tls_ca: str | None, tls_cert: str | None,
        tls_key: str | None) -> None:
    """Subscribe to TOPIC and print each message as it arrives (Ctrl-C to stop)."""

    from flux.client.trio import connect

    tls = _tls(url, tls_ca, tls_cert, tls_key)

    async def run() -> None:
        seen = 0
        async with connect(url, token=token, user=user, password=password, tls=tls) as client, \
                client.subscribe(topic, name=name, read_old=read_old,
                                 from_offset=from_offset, max_in_flight=max_in_flight,
                                 shared=shared, key_ordered=key_ordered) as subscription:
            async for msg in subscription:
                text = msg.payload.decode("utf-8", "backslashreplace")
                key = f" key={msg.key}" if msg.key is not None else ""
                headers = "".join(f" {n}={v}" for n, v in msg.headers.items())
                click.echo(f"{msg.topic}@{msg.offset} id={msg.id}{key}{headers} {text}")
                if not no_ack:
                    await msg.ack()
                seen += 1
                if count is not None and seen >= count:
                    break

    _run(run)


@main.command()
@click.argument("pattern", default="*")
@click.option("--url", default=DEFAULT_URL, show_default=True, help="The router's address.")
@click.option("--json", "as_json", is_flag=True, help="Print every shard's reply as JSON.")
@click.option("--wait", type=click.FloatRange(min=0.1), default=5.0, show_default=True,
              help="Seconds to wait for each shard; one that does not answer (recovering,"
                   " restarting) is shown as such.")
@credential_options
def stats(pattern: str, url: str, as_json: bool, wait: float, token: str | None,
          user: str | None, password: str | None, tls_ca: str | None, tls_cert: str | None,
          tls_key: str | None) -> None:
    """Show what each shard holds: topics, subscriptions (cursor, lag, in flight), counters.

    PATTERN keeps the topics whose name matches it (a glob, e.g. 'orders.*'). A shard
    that does not answer within --wait (one recovering its disk topics answers Busy)
    is listed with why, and the others are shown.
    """

    from flux import stats_view
    from flux.client.trio import connect

    async def run() -> None:
        async with connect(url, retry_deadline=10.0, token=token, user=user, password=password,
                           tls=_tls(url, tls_ca, tls_cert, tls_key)) as client:
            replies = stats_view.select(await client.stats(wait=wait, partial=True), pattern)
        if as_json:
            click.echo(stats_view.as_json(replies))
        else:
            stats_view.show(replies, pattern)

    _run(run)


@main.command()
@click.option("--url", default=DEFAULT_URL, show_default=True, help="The router's address.")
@click.option("--interval", type=click.FloatRange(min=0.1), default=1.0, show_default=True,
              help="Seconds between refreshes.")
@credential_options
def top(url: str, interval: float, token: str | None, user: str | None,
        password: str | None, tls_ca: str | None, tls_cert: str | None,
        tls_key: str | None) -> None:
    """A live view: rates per shard and topic, lag per subscription (q quits)."""
    from flux.monitor.top import run_top

    _run(lambda: run_top(url, interval, token=token, user=user, password=password,
                         tls=_tls(url, tls_ca, tls_cert, tls_key)))


@main.group()
def dlq() -> None:
    """Dead letters (G11): what each subscription of a topic gave up on, and redrive."""


@dlq.command("list")
@click.argument("topic")
@click.option("--url", default=DEFAULT_URL, show_default=True, help="The router's address.")
@click.option("--json", "as_json", is_flag=True, help="Print the dead letters as JSON.")
@credential_options
def dlq_list(topic: str, url: str, as_json: bool, token: str | None, user: str | None,
             password: str | None, tls_ca: str | None, tls_cert: str | None,
             tls_key: str | None) -> None:
    """Show the dead letters of every subscription of TOPIC, with why each died."""
    from flux import dead_letter_tool as tool
    from flux.client.trio import connect

    async def run() -> None:
        async with connect(url, retry_deadline=10.0, token=token, user=user, password=password,
                           tls=_tls(url, tls_ca, tls_cert, tls_key)) as client:
            rows = await tool.list_rows(client, topic)
        tool.show(rows, topic, as_json)

    _run(run)


@dlq.command("redrive")
@click.argument("topic")
@click.option("--subscription", "-s", required=True,
              help="The subscription whose dead letters go back to TOPIC.")
@click.option("--url", default=DEFAULT_URL, show_default=True, help="The router's address.")
@credential_options
def dlq_redrive(topic: str, subscription: str, url: str, token: str | None, user: str | None,
                password: str | None, tls_ca: str | None, tls_cert: str | None,
                tls_key: str | None) -> None:
    """Publish SUBSCRIPTION's dead letters to TOPIC again (every subscription of TOPIC
    gets them), with ids derived from each dead letter's generation and offset: a
    redrive run twice stores nothing twice within TOPIC's dedup window."""
    from flux import dead_letter_tool as tool
    from flux.client.trio import connect

    async def run() -> None:
        async with connect(url, token=token, user=user, password=password,
                           tls=_tls(url, tls_ca, tls_cert, tls_key)) as client:
            sent, duplicates = await tool.redrive(client, topic, subscription)
        again = f" ({duplicates} stored by an earlier redrive)" if duplicates else ""
        click.echo(f"redrove {sent} dead letters of {topic}/{subscription} to {topic}{again}")

    _run(run)


@main.group()
def auth() -> None:
    """Make credentials for the config's auth section (see README, "Security")."""


@auth.command("hash")
def auth_hash() -> None:
    """Print the stored form of a password (scrypt) for a user's 'password' key.

    Reads the password from the terminal (twice), or one line of stdin when piped.
    """
    from flux.auth.credentials import hash_password

    if sys.stdin.isatty():
        password = click.prompt("password", hide_input=True, confirmation_prompt=True)
    else:
        password = sys.stdin.readline().rstrip("\r\n")
    if not password:
        raise click.ClickException("the password is empty")
    click.echo(hash_password(password))


@auth.command("token")
def auth_token() -> None:
    """Print a new random token and its SHA-256 (the 'token_sha256' of a user).

    Give the token to the client (FLUX_TOKEN); keep only the digest in the config.
    """
    import secrets

    from flux.auth.credentials import token_digest

    token = secrets.token_urlsafe(32)
    click.echo(f"token: {token}\ntoken_sha256: {token_digest(token)}")


def _run(fn: Any) -> None:
    import trio

    try:
        trio.run(fn)
    except KeyboardInterrupt:
        pass
    except errors.FluxError as exc:
        raise click.ClickException(f"{type(exc).__name__}: {exc}") from None
    except OSError as exc:
        raise click.ClickException(f"cannot reach the broker: {exc}") from None


def _register_tool_commands() -> None:
    # imported here, not at the top: they pull in the simulator and the bench harness
    from flux.bench.command import bench
    from flux.sim.command import sim

    main.add_command(sim)
    main.add_command(bench)


_register_tool_commands()

if __name__ == "__main__":
    main()
