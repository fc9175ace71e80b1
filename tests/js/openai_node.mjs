// OpenAI's Node SDK against the worker's /v1 (tests/test_js_clients.py reads what it prints).
// usage: node openai_node.mjs BASE_URL AUDIO
import fs from "node:fs";
import OpenAI, { toFile } from "openai";

const [base, audio] = process.argv.slice(2);
const client = new OpenAI({ baseURL: `${base}/v1`, apiKey: "unused", maxRetries: 0 });
const file = () => fs.createReadStream(audio);
const out = {};

out.json = await client.audio.transcriptions.create({ model: "whisper-1", file: file() });
const verbose = await client.audio.transcriptions.create({
  model: "whisper-1",
  file: file(),
  response_format: "verbose_json",
  timestamp_granularities: ["word", "segment"],
  temperature: 0.2,
  language: "en",
});
out.verbose = {
  language: verbose.language,
  duration: verbose.duration,
  segments: verbose.segments.map((s) => ({ start: s.start, end: s.end, temperature: s.temperature })),
  words: verbose.words.map((w) => [w.word, w.start, w.end]),
};
out.srt = await client.audio.transcriptions.create({ model: "whisper-1", file: file(), response_format: "srt" });
out.events = [];
const stream = await client.audio.transcriptions.create({ model: "gpt-4o-transcribe", file: file(), stream: true });
for await (const event of stream) out.events.push(event);
try {
  await client.audio.transcriptions.create({ model: "whisper-1", file: await toFile(Buffer.from("not audio"), "a.wav") });
} catch (err) {
  out.error = { status: err.status, code: err.code, type: err.type, name: err.constructor.name };
}
console.log(JSON.stringify(out));
