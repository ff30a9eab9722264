'use strict';
// Drives the official Node.js RocketMQ 5 client (rocketmq-client-nodejs) against a
// broker for tests/compat/test_node_client.py:
//
//   node scenario.js <scenario> '<json args>'
//
// The endpoint is args.endpoint (host:port of the broker's gRPC port). The result is ONE
// JSON line on stdout (the last line); the client's own log lines go to stderr. Every
// client this script starts is shut down before it exits; a shutdown that hangs is
// cut short (SHUTDOWN_CAP_MS) and reported in the result's "shutdown" field.
const {
  Producer, SimpleConsumer, PushConsumer, FilterExpression, ConsumeResult,
} = require('rocketmq-client-nodejs');
const { FilterType, TransactionResolution } =
  require('rocketmq-client-nodejs/proto/apache/rocketmq/v2/definition_pb');

const SHUTDOWN_CAP_MS = 15000;
const started = [];
const shutdownReport = [];

const logger = {
  // the client logs through this; keep stdout for the one JSON result line
  // (debug must exist: Transaction.commit calls logger.debug unguarded)
  info: () => {},
  debug: () => {},
  warn: (...a) => console.error('WARN', ...a),
  error: (...a) => console.error('ERROR', ...a),
};

const sleep = ms => new Promise(r => setTimeout(r, ms));

async function start(client) {
  await client.startup();
  started.push(client);
  return client;
}

async function stop(client) {
  const i = started.indexOf(client);
  if (i >= 0) started.splice(i, 1);
  const t0 = Date.now();
  let timer;
  const capped = new Promise(r => { timer = setTimeout(() => r('timeout'), SHUTDOWN_CAP_MS); });
  const outcome = await Promise.race([
    client.shutdown().then(() => 'ok', e => `error: ${e && e.message}`), capped]);
  clearTimeout(timer);
  shutdownReport.push({ client: client.constructor.name, outcome, ms: Date.now() - t0 });
}

function producer(a, extra = {}) {
  return start(new Producer({ endpoints: a.endpoint, namespace: '', logger,
    requestTimeout: 10000, topics: a.topics || [a.topic], ...extra }));
}

function filterOf(f) {
  if (!f) return FilterExpression.SUB_ALL;
  return new FilterExpression(f.expression, f.type === 'SQL' ? FilterType.SQL : FilterType.TAG);
}

function simpleConsumer(a, group, topic, filter, awaitMs) {
  return start(new SimpleConsumer({ endpoints: a.endpoint, namespace: '', logger,
    requestTimeout: 10000, consumerGroup: group, awaitDuration: awaitMs || 2000,
    subscriptions: new Map([[topic, filterOf(filter)]]) }));
}

function view(m) {
  return {
    messageId: m.messageId, topic: m.topic, body: m.body.toString('utf8'), tag: m.tag,
    keys: m.keys, properties: Object.fromEntries(m.properties), messageGroup: m.messageGroup,
    deliveryAttempt: m.deliveryAttempt, corrupted: !!m.corrupted,
    deliveryTimestamp: m.deliveryTimestamp ? m.deliveryTimestamp.getTime() : null,
    bornTimestamp: m.bornTimestamp ? m.bornTimestamp.getTime() : null,
    bornHost: m.bornHost, receivedAt: Date.now(),
  };
}

function outgoing(topic, spec) {
  const o = { topic, body: Buffer.from(spec.body, 'utf8') };
  if (spec.tag) o.tag = spec.tag;
  if (spec.keys) o.keys = spec.keys;
  if (spec.properties) o.properties = new Map(Object.entries(spec.properties));
  if (spec.messageGroup) o.messageGroup = spec.messageGroup;
  if (spec.deliveryTimestamp) o.deliveryTimestamp = new Date(spec.deliveryTimestamp);
  return o;
}

function receipt(r) {
  return { messageId: r.messageId, transactionId: r.transactionId, offset: r.offset };
}

function errorOf(e) {
  return { name: e && e.constructor && e.constructor.name, code: e && e.code,
    message: e && e.message };
}

// receive until n messages (acking each when ack), at most maxCalls receives
async function receiveUntil(c, n, { invisibleMs = 30000, maxCalls = 20, ack = true } = {}) {
  const got = [];
  for (let i = 0; i < maxCalls && got.length < n; i++) {
    for (const m of await c.receive(32, invisibleMs)) {
      got.push(view(m));
      if (ack) await c.ack(m);
    }
  }
  return got;
}

const scenarios = {
  // sends a.messages (sync: one await after the other; async: all in flight at once)
  async produce(a) {
    const p = await producer(a);
    const specs = a.messages;
    let receipts;
    if (a.mode === 'async') {
      receipts = await Promise.all(specs.map(s => p.send(outgoing(a.topic, s))));
    } else {
      receipts = [];
      for (const s of specs) receipts.push(await p.send(outgoing(a.topic, s)));
    }
    await stop(p);
    return { receipts: receipts.map(receipt) };
  },

  // receives (and acks) until a.count messages or a.maxCalls receives
  async consume(a) {
    const c = await simpleConsumer(a, a.group, a.topic, a.filter, a.awaitMs);
    const messages = await receiveUntil(c, a.count, { maxCalls: a.maxCalls || 20 });
    // then one more receive: nothing else may match
    const extra = a.extraPoll ? (await c.receive(32, 30000)).map(view) : [];
    await stop(c);
    return { messages, extra };
  },

  // a.delayMs after now: the due time is reported with the message as received
  async delay(a) {
    const p = await producer(a);
    const due = Date.now() + a.delayMs;
    const r = await p.send(outgoing(a.topic, { body: 'later', tag: 'TagD',
      deliveryTimestamp: due }));
    const sentAt = Date.now();
    await stop(p);
    const c = await simpleConsumer(a, a.group, a.topic, null, 5000);
    const messages = await receiveUntil(c, 1, { maxCalls: 6 });
    await stop(c);
    return { due, sentAt, receipt: receipt(r), messages };
  },

  // two delayed messages; the first is recalled with its receipt's handle, twice (the
  // second recall must fail); then the kept one is received when due
  async recall(a) {
    const p = await producer(a);
    const due = Date.now() + a.delayMs;
    const drop = await p.send(outgoing(a.topic, { body: 'drop', deliveryTimestamp: due }));
    const keep = await p.send(outgoing(a.topic, { body: 'keep', deliveryTimestamp: due }));
    const recalled = await p.recallMessage(a.topic, drop.recallHandle);
    let again = null;
    try {
      await p.recallMessage(a.topic, drop.recallHandle);
    } catch (e) {
      again = String(e && e.message || e);
    }
    await stop(p);
    const c = await simpleConsumer(a, a.group, a.topic, null, 5000);
    const messages = await receiveUntil(c, 1, { maxCalls: 6 });
    const extra = (await c.receive(32, 30000)).map(view);
    await stop(c);
    return { dropId: drop.messageId, keepId: keep.messageId, handle: drop.recallHandle,
      recalledId: recalled.messageId, again, messages, extra };
  },

  // commit, rollback, and one left open for the broker's check-back (checker: COMMIT)
  async transaction(a) {
    const asked = [];
    const checker = {
      async check(m) {
        asked.push({ body: m.body.toString('utf8'), messageId: m.messageId });
        return m.body.toString('utf8') === 'check-me' ? TransactionResolution.COMMIT
          : TransactionResolution.TRANSACTION_RESOLUTION_UNSPECIFIED;
      },
    };
    const p = await producer(a, { checker });
    const sendTx = async (body) => {
      const tx = p.beginTransaction();
      const r = await p.send(outgoing(a.topic, { body, tag: 'Tx' }), tx);
      return [tx, r];
    };
    const [tx1, r1] = await sendTx('commit-me');
    const [tx2, r2] = await sendTx('roll-me');
    const [, r3] = await sendTx('check-me');      // never ended by the producer
    await tx1.commit();
    await tx2.rollback();
    const deadline = Date.now() + a.checkWaitMs;
    while (!asked.some(x => x.body === 'check-me') && Date.now() < deadline) await sleep(100);
    const c = await simpleConsumer(a, a.group, a.topic, null, 3000);
    const messages = await receiveUntil(c, 2, { maxCalls: 8 });
    const extra = (await c.receive(32, 30000)).map(view);
    await stop(c);
    await stop(p);
    return { receipts: [r1, r2, r3].map(receipt), asked, messages, extra };
  },

  // not acked within the invisible duration: redelivered (attempt 2); then a longer
  // invisible duration set by changeInvisibleDuration holds it; stale handle refused
  async redelivery(a) {
    const p = await producer(a);
    const sent = await p.send(outgoing(a.topic, { body: 'retry me', keys: ['r1'] }));
    await stop(p);
    const c = await simpleConsumer(a, a.group, a.topic, null, 5000);
    const out = { sent: receipt(sent) };
    const first = await c.receive(32, 1000);
    out.first = first.map(view);
    const t0 = Date.now();
    let second = [];
    for (let i = 0; i < 6 && !second.length; i++) second = await c.receive(32, 1000);
    out.second = second.map(view);
    out.secondAfterMs = Date.now() - t0;
    if (second.length) {
      const m = second[0];
      const oldHandle = m.receiptHandle;
      await c.changeInvisibleDuration(m, 60000);
      out.handleChanged = m.receiptHandle !== oldHandle;
      // 1 s was the lease it was received with: after 2 x 3 s of polls it is still held
      out.whileHeld = [...(await c.receive(32, 1000)), ...(await c.receive(32, 1000))].map(view);
      await c.ack(m);
      out.acked = true;
      try {
        await c.ack(first[0]);
        out.staleAck = 'accepted';
      } catch (e) {
        out.staleAck = errorOf(e);
      }
    }
    // invisible duration 0 on receive: what the client sends and what the broker says
    try {
      out.zeroInvisible = (await c.receive(1, 0)).map(view);
    } catch (e) {
      out.zeroInvisible = errorOf(e);
    }
    await stop(c);
    return out;
  },

  // FIFO with a SimpleConsumer: receive a batch, receive again while it is in flight
  // (unacked), then ack the batch; until a.count messages
  async fifo_simple(a) {
    const c = await simpleConsumer(a, a.group, a.topic, null, a.awaitMs);
    const rounds = [];
    let n = 0;
    for (let i = 0; i < 20 && n < a.count; i++) {
      const batch = await c.receive(32, 30000);
      if (!batch.length) continue;
      const whileInFlight = await c.receive(32, 30000);
      rounds.push({ batch: batch.map(view), whileInFlight: whileInFlight.map(view) });
      for (const m of [...batch, ...whileInFlight]) await c.ack(m);
      n += batch.length + whileInFlight.length;
    }
    await stop(c);
    return { rounds };
  },

  // group a.group allows 2 deliveries: attempts 1, 2, then the DLQ
  async dlq(a) {
    const p = await producer(a);
    const sent = await p.send(outgoing(a.topic, { body: 'poison', keys: ['p1'] }));
    await stop(p);
    const c = await simpleConsumer(a, a.group, a.topic, null, 4000);
    const attempts = [];
    for (let i = 0; i < 8 && attempts.length < 2; i++) {
      for (const m of await c.receive(32, 1000)) attempts.push(view(m));
    }
    const after = [];
    for (let i = 0; i < 2; i++) after.push(...(await c.receive(32, 1000)).map(view));
    await stop(c);
    const d = await simpleConsumer(a, a.dlqGroup, a.dlqTopic, null, 2000);
    const dlq = await receiveUntil(d, 1, { maxCalls: 5 });
    await stop(d);
    return { sent: receipt(sent), attempts, after, dlq };
  },

  // PushConsumer; a.failFirst: the listener answers FAILURE to each message's first
  // delivery (SUCCESS after); a.holdMs: each consume takes that long, and the most
  // consumes of one message group in flight at once is reported (maxInFlight);
  // a.produceFirst: a.messages are sent before the consumer starts (else after)
  async push(a) {
    const consumed = [];
    const failed = new Set();
    const inFlight = new Map();
    const maxInFlight = {};
    let ok = 0;
    let done;
    const finished = new Promise(r => { done = r; });
    const listener = {
      async consume(m) {
        const v = view(m);
        const g = m.messageGroup || '';
        inFlight.set(g, (inFlight.get(g) || 0) + 1);
        maxInFlight[g] = Math.max(maxInFlight[g] || 0, inFlight.get(g));
        if (a.holdMs) await sleep(a.holdMs);
        inFlight.set(g, inFlight.get(g) - 1);
        let result = ConsumeResult.SUCCESS;
        if (a.failFirst && !failed.has(m.messageId)) {
          failed.add(m.messageId);
          result = ConsumeResult.FAILURE;
        }
        v.result = result.name;
        consumed.push(v);
        if (result === ConsumeResult.SUCCESS && ++ok >= a.expect) done();
        return result;
      },
    };
    const receipts = [];
    const send = async () => {
      const p = await producer(a);
      for (const s of a.messages) receipts.push(await p.send(outgoing(a.topic, s)));
      await stop(p);
    };
    if (a.produceFirst && a.messages) await send();
    const c = await start(new PushConsumer({ endpoints: a.endpoint, namespace: '', logger,
      requestTimeout: 10000, consumerGroup: a.group,
      subscriptions: new Map([[a.topic, filterOf(a.filter)]]), messageListener: listener }));
    if (!a.produceFirst && a.messages) await send();
    let timer;
    const outcome = await Promise.race([finished.then(() => 'all consumed'),
      new Promise(r => { timer = setTimeout(() => r('timeout'), a.waitMs); })]);
    clearTimeout(timer);
    await sleep(a.settleMs || 0);              // a duplicate delivery would show up here
    const fifo = c.getPushConsumerSettings().isFifo();     // as told by the broker
    await stop(c);
    return { outcome, fifo, consumed, maxInFlight, receipts: receipts.map(receipt) };
  },
};

async function main() {
  const [name, json] = process.argv.slice(2);
  const fn = scenarios[name];
  if (!fn) throw new Error(`unknown scenario ${name}`);
  const t0 = Date.now();
  let result;
  try {
    result = await fn(JSON.parse(json || '{}'));
  } finally {
    for (const c of [...started].reverse()) await stop(c);
  }
  result.shutdown = shutdownReport;
  result.elapsedMs = Date.now() - t0;
  process.stdout.write(`${JSON.stringify(result)}\n`);
}

main().then(() => process.exit(0), (e) => {
  console.error('scenario failed:', e && e.stack ? e.stack : e);
  process.stdout.write(`${JSON.stringify({ error: errorOf(e), shutdown: shutdownReport })}\n`);
  process.exit(1);
});
