// kafkajs reader for test_dlt_ledger.py: read N records of TOPIC from the
// beginning (consumer group) and print each as a JSON line (partition,
// offset, value, header names). Bounded: exits non-zero after TIMEOUT_MS.
//   node read_topic.js BOOTSTRAP TOPIC N
const { Kafka, logLevel } = require("kafkajs");

const [bootstrap, topic, nStr] = process.argv.slice(2);
const n = Number(nStr);
const TIMEOUT_MS = 90000;
setTimeout(() => { console.error("kafkajs read timed out"); process.exit(3); }, TIMEOUT_MS).unref();

async function main() {
  const kafka = new Kafka({ clientId: "antidote-js-dlt", brokers: [bootstrap], logLevel: logLevel.ERROR,
                            retry: { retries: 5 } });
  const consumer = kafka.consumer({ groupId: `js-read-${topic}-${Date.now()}` });
  await consumer.connect();
  await consumer.subscribe({ topic, fromBeginning: true });
  let seen = 0;
  await new Promise((resolve, reject) => {
    consumer.run({
      eachMessage: async ({ partition, message }) => {
        console.log(JSON.stringify({ partition, offset: Number(message.offset),
          value: message.value === null ? null : message.value.toString(),
          headers: Object.keys(message.headers) }));
        if (++seen === n) resolve();
      },
    }).catch(reject);
  });
  await consumer.disconnect();
}

main().then(() => process.exit(0), (e) => { console.error(e); process.exit(1); });
