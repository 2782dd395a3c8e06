import { convo } from "./convo.js";
import { DELETE } from "@loom/sdk";

const state = await convo.agentState.get(); // version 0 and an empty body before the first write
const written = await convo.agentState.put({ step: "sizes", offer: "familia-plus" }); // merge_by_key by default
if (!written.stored) console.log(written.reason); // over_cap, not_declared_field, or conflict

// Compare-and-swap of the whole state, at the version read
await convo.agentState.put({ step: "checkout" }, { mode: "cas", ifVersion: state.version });
// Remove one field, keep the others
await convo.agentState.put({ offer: DELETE });
