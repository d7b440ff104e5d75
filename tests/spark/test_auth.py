"""The ``flux`` source and sink against a broker with auth on (G13) or TLS: credentials and
CA files as options."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import pytest

from flux.spark.options import SinkOptions, SourceOptions
from tests.integration.test_auth import ROOT, config

if TYPE_CHECKING:
    from tests.conftest import BrokerFactory

pytestmark = pytest.mark.spark


def test_credential_options_are_checked_when_the_query_is_defined() -> None:
    opts = SourceOptions.parse({"topics": "a", "user": "u", "password": "p"})
    assert opts.credentials == {"user": "u", "password": "p"}
    with pytest.raises(ValueError, match="token"):
        SourceOptions.parse({"topics": "a", "token": "t", "user": "u", "password": "p"})
    with pytest.raises(ValueError, match="password"):
        SinkOptions.parse({"topic": "a", "user": "u"}, ["payload"])


def test_source_and_sink_take_a_token_or_a_user_and_password(
        spark: Any, broker_factory: BrokerFactory) -> None:
    broker = broker_factory("http.enabled=false", config=config())
    df = spark.createDataFrame([("k1", "one"), ("k2", "two")], "id string, payload string")
    (df.write.format("flux").option("url", broker.url).option("topic", "orders.eu")
     .option("user", "carol").option("password", "carol-pw").mode("append").save())
    rows = (spark.read.format("flux").option("url", broker.url).option("topics", "orders.eu")
            .option("token", ROOT).load().select("id", "payload").collect())
    assert sorted((r.id, bytes(r.payload)) for r in rows) == [("k1", b"one"), ("k2", b"two")]
    with pytest.raises(Exception, match="AuthenticationFailed"):
        (spark.read.format("flux").option("url", broker.url).option("topics", "orders.eu")
         .load().collect())


def test_source_and_sink_speak_tls(spark: Any, broker_factory: BrokerFactory,
                                   tmp_path: Any) -> None:
    from tests.integration.test_tls import Pki

    pki = Pki(tmp_path / "pki")
    broker = broker_factory("http.enabled=false", config=pki.config())
    url = f"flux+tls://{broker.address}"
    assert SinkOptions.parse({"topic": "t", "url": url, "tlsCa": pki.ca_file},
                             ["payload"]).credentials == {"ca": pki.ca_file}
    df = spark.createDataFrame([("k1", "one")], "id string, payload string")
    (df.write.format("flux").option("url", url).option("tlsCa", pki.ca_file)
     .option("topic", "secure").mode("append").save())
    rows = (spark.read.format("flux").option("url", f"{url}?ca={pki.ca_file}")
            .option("topics", "secure").load().select("id", "payload").collect())
    assert [(r.id, bytes(r.payload)) for r in rows] == [("k1", b"one")]
