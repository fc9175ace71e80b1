// AssemblyAI's JavaScript SDK against the worker: upload, transcribe, poll, then the
// transcript's subtitles, sentences and word search, then its deletion.
// usage: node assemblyai.mjs BASE_URL AUDIO
import { AssemblyAI } from "assemblyai";

const [base, audio] = process.argv.slice(2);
const client = new AssemblyAI({ apiKey: "unused", baseUrl: base });
const t = await client.transcripts.transcribe(
  { audio, speech_models: ["universal"], language_detection: true, format_text: true },
  { pollingInterval: 500, pollingTimeout: 120000 },
);
const out = {
  status: t.status,
  error: t.error ?? null,
  text: t.text,
  language_code: t.language_code,
  words: t.words.length,
  audio_duration: t.audio_duration,
};
out.srt = await client.transcripts.subtitles(t.id, "srt");
out.sentences = (await client.transcripts.sentences(t.id)).sentences.map((s) => s.text);
out.search = (await client.transcripts.wordSearch(t.id, ["country"])).total_count;
out.deleted = (await client.transcripts.delete(t.id)).text;
console.log(JSON.stringify(out));
