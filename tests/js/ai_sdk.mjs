// The Vercel AI SDK's transcribe() with its OpenAI provider pointed at the worker.
// usage: node ai_sdk.mjs BASE_URL AUDIO
import fs from "node:fs";
import { createOpenAI } from "@ai-sdk/openai";
import { experimental_transcribe as transcribe } from "ai";

const [base, audio] = process.argv.slice(2);
const openai = createOpenAI({ baseURL: `${base}/v1`, apiKey: "unused" });
const bytes = fs.readFileSync(audio);
const pick = (r) => ({
  text: r.text,
  language: r.language ?? null,
  duration: r.durationInSeconds ?? null,
  segments: r.segments,
  warnings: r.warnings,
});
const out = {};
// Without options the SDK sends model and file only (json).
out.plain = pick(await transcribe({ model: openai.transcription("gpt-4o-mini-transcribe"), audio: bytes }));
// With provider options it asks whisper-1 for verbose_json, every option a form field's text.
out.options = pick(
  await transcribe({
    model: openai.transcription("whisper-1"),
    audio: bytes,
    providerOptions: { openai: { language: "en", temperature: 0, timestampGranularities: ["word"] } },
  }),
);
console.log(JSON.stringify(out));
