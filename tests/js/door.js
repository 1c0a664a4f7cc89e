// kafkajs producer for test_produce_door.py: send each record of SPEC (a JSON
// list of {key, value, headers}) to partition 0 of TOPIC in its own request,
// and print one JSON line per record: {ok} or {ok: false, type, message}.
// Bounded: exits non-zero after TIMEOUT_MS.
//   node door.js BOOTSTRAP TOPIC SPEC
const { Kafka, logLevel } = require("kafkajs");

const [bootstrap, topic, spec] = process.argv.slice(2);
const TIMEOUT_MS = 90000;
setTimeout(() => { console.error("kafkajs door timed out"); process.exit(3); }, TIMEOUT_MS).unref();

async function main() {
  const kafka = new Kafka({ clientId: "antidote-js-door", brokers: [bootstrap], logLevel: logLevel.NOTHING,
                            retry: { retries: 0 } });
  const producer = kafka.producer();
  await producer.connect();
  for (const m of JSON.parse(spec)) {
    try {
      await producer.send({ topic, acks: -1, messages: [{ partition: 0, ...m }] });
      console.log(JSON.stringify({ ok: true }));
    } catch (e) {
      const cause = e.cause || e;
      console.log(JSON.stringify({ ok: false, type: cause.type || e.type || e.name,
                                   message: String(cause.message || e.message) }));
    }
  }
  await producer.disconnect();
}

main().then(() => process.exit(0), (e) => { console.error(e); process.exit(1); });
