// A user's script: the typed planes, the generated client, errors, versions as bigint.
import { Agent, errors, type MemorySetAnswer } from "@loom/sdk";

const bot = new Agent({ org: "acme", namespace: "support", agent: "triage-bot", baseUrl: process.env.LOOM_API_URL });

export async function main(): Promise<bigint> {
  await bot.workingMemory.set("cursor: ticket 4812", "state", { runId: "run-7" });
  const rendered = await bot.workingMemory.render({ runId: "run-7" });
  const text: string | undefined = rendered.rendered;
  console.log(text);
  const row: MemorySetAnswer = await bot.client.memory.set({ key: "k", value: "v" });
  const version: bigint | undefined = row.version;
  const packed = await bot.context.pack({ user_id: "u-42", query: "refund policy" });
  const prefix: number | undefined = packed.stable_prefix_chars;
  console.log(prefix);
  try {
    await bot.workingMemory.append("more", "state", { runId: "run-7" });
  } catch (error) {
    if (error instanceof errors.WorkingMemoryLimitExceeded) {
      const over: number | null = error.charLimit;
      console.log(over);
    } else if (error instanceof errors.RateLimited) {
      const wait: number | null = error.retryAfter;
      console.log(wait);
    }
  }
  const convo = bot.conversation("c-1");
  const state = await convo.agentState.get();
  const later: bigint = state.version;
  for (const failure of convo.agentState.conflicts) console.log(failure.write.ifVersion);
  return version ?? later;
}
