// Mistakes the types must catch: each line below is a compile error under --strict.
import { Agent, DELETE } from "@loom/sdk";

const bot = new Agent({ org: "acme", namespace: "support", agent: "triage-bot" });
const convo = bot.conversation("c-1");
const state = await convo.agentState.get();
const rounded: number = state.version;
await convo.agentState.put({ offer: DELETE }, { mode: "swap" });
await bot.client.memory.set({ key: "k" });
await bot.client.workingMemory.sett({ block_key: "state" });
console.log(rounded);
