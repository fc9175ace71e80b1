// Deepgram's JavaScript SDK (v5) against the worker: a file, then the same audio live.
// usage: node deepgram.mjs BASE_URL WS_URL WAV (16-kHz mono 16-bit)
import fs from "node:fs";
import { DeepgramClient } from "@deepgram/sdk";

const [base, wsBase, wav] = process.argv.slice(2);
const client = new DeepgramClient({
  apiKey: "unused",
  environment: { base, production: wsBase, agent: wsBase, agentRest: base },
});
const out = {};
const file = await client.listen.v1.media.transcribeFile(fs.createReadStream(wav), {
  model: "nova-3",
  smart_format: true,
  utterances: true,
  words: true,
});
out.file = {
  transcript: file.results.channels[0].alternatives[0].transcript,
  words: file.results.channels[0].alternatives[0].words.length,
  utterances: file.results.utterances.length,
  duration: file.metadata.duration,
};
try {
  await client.listen.v1.media.transcribeUrl({ url: "file:///etc/passwd" }, { model: "nova-3" });
} catch (err) {
  out.refused = { status: err.statusCode, body: err.body };
}

const pcm = fs.readFileSync(wav).subarray(44);
const live = { finals: [], types: [], close: null, errors: [] };
const socket = await client.listen.v1.connect({
  model: "nova-3",
  encoding: "linear16",
  sample_rate: 16000,
  interim_results: "true",
  utterance_end_ms: 1000,
  vad_events: "true",
  reconnectAttempts: 0,
});
const closed = new Promise((resolve) => {
  socket.on("close", (event) => {
    live.close = event.code;
    resolve();
  });
});
socket.on("error", (err) => live.errors.push(String(err?.message ?? err)));
socket.on("message", (message) => {
  live.types.push(message.type);
  if (message.type === "Results" && message.is_final) {
    live.finals.push(message.channel.alternatives[0].transcript);
  }
});
socket.connect();
await socket.waitForOpen();
// 100-ms messages, five times faster than real time.
for (let i = 0; i < pcm.length; i += 3200) {
  socket.sendMedia(pcm.subarray(i, i + 3200));
  await new Promise((r) => setTimeout(r, 20));
}
socket.sendCloseStream({ type: "CloseStream" });
await Promise.race([closed, new Promise((r) => setTimeout(r, 120000))]);
out.live = live;
console.log(JSON.stringify(out));
process.exit(0);
