// The README's way of naming a conversation: an Agent, then bot.conversation(id).
import { Agent } from "@loom/sdk";

const bot = new Agent({
  org: process.env.SEED_ORG ?? "acme",
  namespace: process.env.SEED_NAMESPACE ?? "shop",
  agent: "shopping_assistant",
  baseUrl: process.env.LOOM_API_URL,
});
export const convo = bot.conversation(process.env.SEED_CONVERSATION ?? "c-1");
