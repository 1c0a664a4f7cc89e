// kafkajs group consumer for test_kafkajs_poison.py: subscribe GROUP to
// TOPIC from the beginning and print each message as one JSON line the moment
// it arrives (partition, offset, key, value), so a test can watch progress
// while it changes the world (a dead-letter cluster going away and back).
// After N messages it keeps reading SETTLE_MS more (a duplicate or a
// record that should have been removed still shows up), then prints
// {"end": seen} and exits 0. Bounded: exits 3 after TIMEOUT_MS.
//   node stream.js BOOTSTRAP TOPIC GROUP N [TIMEOUT_MS]
const { Kafka, logLevel } = require("kafkajs");

const [bootstrap, topic, group, nStr, timeoutStr] = process.argv.slice(2);
const n = Number(nStr);
const TIMEOUT_MS = Number(timeoutStr || 90000);
const SETTLE_MS = 2000;
setTimeout(() => { console.error("kafkajs stream timed out"); process.exit(3); }, TIMEOUT_MS).unref();

const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

async function main() {
  const kafka = new Kafka({ clientId: "antidote-js-stream", brokers: [bootstrap], logLevel: logLevel.ERROR,
                            retry: { retries: 8 } });
  const consumer = kafka.consumer({ groupId: group });
  await consumer.connect();
  await consumer.subscribe({ topic, fromBeginning: true });
  let seen = 0;
  let all;
  const allSeen = new Promise((resolve) => { all = resolve; });
  await consumer.run({
    eachMessage: async ({ partition, message }) => {
      process.stdout.write(JSON.stringify({
        partition, offset: Number(message.offset),
        key: message.key === null ? null : message.key.toString(),
        value: message.value === null ? null : message.value.toString("base64") }) + "\n");
      if (++seen === n) all();
    },
  });
  await allSeen;
  await sleep(SETTLE_MS);
  await consumer.disconnect();
  process.stdout.write(JSON.stringify({ end: seen }) + "\n");
}

main().then(() => process.exit(0), (e) => { console.error(e); process.exit(1); });
