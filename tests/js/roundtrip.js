// kafkajs round trip for test_kafkajs.py: produce N records with keys, headers
// and timestamps to partition 0 of TOPIC, read them back (consumer group), and
// print them as JSON lines on stdout. Bounded: exits non-zero after TIMEOUT_MS.
//   node roundtrip.js BOOTSTRAP TOPIC N
const { Kafka, logLevel } = require("kafkajs");

const [bootstrap, topic, nStr] = process.argv.slice(2);
const n = Number(nStr);
const TIMEOUT_MS = 90000;
setTimeout(() => { console.error("kafkajs roundtrip timed out"); process.exit(3); }, TIMEOUT_MS).unref();

async function main() {
  const kafka = new Kafka({ clientId: "antidote-js-test", brokers: [bootstrap], logLevel: logLevel.ERROR,
                            retry: { retries: 5 } });
  const producer = kafka.producer();
  await producer.connect();
  const messages = [];
  for (let i = 0; i < n; i++) {
    messages.push({ partition: 0, key: `js-key-${i}`, value: `js-value-${i}`,
                    headers: { h: `${i}` }, timestamp: String(1700000000000 + i * 1000) });
  }
  await producer.send({ topic, messages });
  await producer.disconnect();

  const consumer = kafka.consumer({ groupId: `js-${topic}` });
  await consumer.connect();
  await consumer.subscribe({ topic, fromBeginning: true });
  let seen = 0;
  await new Promise((resolve, reject) => {
    consumer.run({
      eachMessage: async ({ partition, message }) => {
        console.log(JSON.stringify({ partition, offset: Number(message.offset),
          key: message.key.toString(), value: message.value.toString(),
          h: message.headers.h.toString(), timestamp: Number(message.timestamp) }));
        if (++seen === n) resolve();
      },
    }).catch(reject);
  });
  await consumer.disconnect();
}

main().then(() => process.exit(0), (e) => { console.error(e); process.exit(1); });
