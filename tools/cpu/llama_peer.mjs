// llama.cpp's batch-1 decode on a GGUF file, through node-llama-cpp's
// prebuilt CPU binaries, for tools/cpu/llama-peer.sh:
//   node llama_peer.mjs MODEL.gguf TOKENS THREADS
// prints {"tokens": N, "seconds": S, "tokens_per_s": R}: the time of TOKENS
// greedy steps after 8 of warm-up (the prompt is one BOS token).
import {getLlama} from "node-llama-cpp";

const [path, n, threads] = [process.argv[2], Number(process.argv[3] || 64), Number(process.argv[4] || 2)];
const llama = await getLlama({gpu: false, build: "never"});
const model = await llama.loadModel({modelPath: path});
const ctx = await model.createContext({contextSize: 1024, threads, batchSize: 512});
const seq = ctx.getSequence();
// The first 8 steps warm up (page faults of the mapping, thread start).
const warm = 8;
let count = 0, t0 = 0;
for await (const tok of seq.evaluate([model.tokens.bos ?? 0], {temperature: 0})) {
	if (count === warm) t0 = performance.now();
	if (++count > warm + n) break;
}
const s = (performance.now() - t0) / 1000;
console.log(JSON.stringify({tokens: n, seconds: s, tokens_per_s: n / s}));
