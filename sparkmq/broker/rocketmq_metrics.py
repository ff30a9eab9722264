"""Broker metrics under Apache RocketMQ 5's OpenTelemetry names, as its Prometheus
exporter writes them (``BrokerMetricsConstant``), so the community's RocketMQ Grafana
dashboards work against a sparkmq broker.

Every sample carries RocketMQ's common labels ``cluster``, ``node_type`` ("broker") and
``node_id`` (the broker name), plus the names' own labels (``topic``,
``consumer_group``, ``message_type``, ``is_retry``, ``is_system``). The values come
from the counters the broker keeps anyway (``metrics.Metrics``) and from its state at
scrape time; nothing is counted twice. The names sparkmq can compute truthfully:

=======================================  ========  =========================================
name                                     type      from
=======================================  ========  =========================================
rocketmq_messages_in_total               counter   messages stored by sends, per topic
rocketmq_throughput_in_total             counter   body bytes stored by sends, per topic
rocketmq_messages_out_total              counter   messages delivered, per topic and group
rocketmq_throughput_out_total            counter   body bytes delivered, per topic and group
rocketmq_send_to_dlq_messages_total      counter   messages moved to a dead-letter topic
rocketmq_topic_number                    gauge     topics
rocketmq_consumer_group_number           gauge     groups with a config or consumers
rocketmq_consumer_lag_messages           gauge     not yet consumed, per group and topic
rocketmq_consumer_connections            gauge     consumer clients, per group
rocketmq_producer_connections            gauge     producer clients
rocketmq_storage_size                    gauge     CommitLog bytes held
rocketmq_broker_permission               gauge     6 read+write, 4 read only (replica, fenced)
=======================================  ========  =========================================
"""
from __future__ import annotations

from ..log.topics import topic_message_type

SYSTEM_PREFIXES = ("RMQ_SYS_", "rmq_sys_", "SCHEDULE_TOPIC", "TRANS_CHECK_MAX_TIME_TOPIC",
                   "%RETRY%", "%DLQ%")


def _is_system(topic: str) -> str:
    return "true" if topic.startswith(SYSTEM_PREFIXES) else "false"


def families(broker) -> tuple[dict, dict]:
    """(counters, gauges): name -> (help, [(labels, value)]) for ``Metrics.render``."""
    cfg, store, m = broker.config, broker.store, broker.metrics
    common = {"cluster": cfg.cluster_name, "node_type": "broker", "node_id": cfg.broker_name}
    topics = store.topics()

    def msg_type(topic: str) -> str:
        return topic_message_type(topics.get(topic)).lower()

    def per_topic(name: str) -> list:
        return [({**common, "topic": lab.get("topic", ""), "message_type":
                  msg_type(lab.get("topic", "")), "is_system": _is_system(lab.get("topic", ""))},
                 v) for lab, v in m.series(name)]

    def per_group(name: str) -> list:
        return [({**common, "topic": lab.get("topic", ""),
                  "consumer_group": lab.get("group", ""),
                  "is_retry": str(lab.get("topic", "").startswith("%RETRY%")).lower(),
                  "is_system": _is_system(lab.get("topic", ""))}, v)
                for lab, v in m.series(name)]
    counters = {
        "rocketmq_messages_in_total": ("Messages stored by sends.",
                                       per_topic("sparkmq_messages_sent_total")),
        "rocketmq_throughput_in_total": ("Body bytes stored by sends.",
                                         per_topic("sparkmq_bytes_sent_total")),
        "rocketmq_messages_out_total": ("Messages delivered to consumers.",
                                        per_group("sparkmq_messages_received_total")),
        "rocketmq_throughput_out_total": ("Body bytes delivered to consumers.",
                                          per_group("sparkmq_bytes_received_total")),
        "rocketmq_send_to_dlq_messages_total": ("Messages moved to a dead-letter topic.",
                                                [(common, broker.pop.dlq_count)]),
    }
    groups = set(store.subscription_groups()) | set(broker.clients.groups())
    lag = [({**common, "topic": t, "consumer_group": k.group, "is_retry": "false",
             "is_system": _is_system(t)}, v)
           for (k, t), v in broker.receiver.consumer_lag().items()]
    consumers = [({**common, "consumer_group": g}, n) for g, n in broker.clients.groups().items()]
    segments = store.commitlog.segments()
    gauges = {
        "rocketmq_topic_number": ("Topics on this broker.", [(common, len(topics))]),
        "rocketmq_consumer_group_number": ("Consumer groups known to this broker.",
                                           [(common, len(groups))]),
        "rocketmq_consumer_lag_messages": ("Messages not yet consumed, per group and topic.",
                                           lag),
        "rocketmq_consumer_connections": ("Consumer clients, per group.", consumers),
        "rocketmq_producer_connections": ("Producer clients.", [(common, max(
            0, broker.clients.count() - sum(n for _, n in consumers)))]),
        "rocketmq_storage_size": ("CommitLog bytes held by this broker.",
                                  [(common, sum(s.size for s in segments))]),
        "rocketmq_broker_permission": ("6: read and write; 4: read only.",
                                       [(common, 6 if broker.ha.write_refusal() is None
                                         else 4)]),
    }
    return counters, gauges
