-- idem_claim.lua: POST /v1/claims on idemd's JSON API.
-- env: IDEM_TOKEN (tenant bearer token), RUN (unique prefix of this run),
--      MODE=fresh (every request a never-used Idempotency-Key -> "acquired", one Raft write)
--      MODE=replay (cycle over NKEYS keys RUN-rep-0.. that http.sh claimed and completed
--                   beforehand -> the stored response is replayed, no write)
--      FP (64 hex fingerprint; the replay keys were claimed with the same one), VERIFY,
--      DELAY_MS (optional: each connection waits this long after every answer, to pace the
--                load; tools/bench/cpu.sh).
local C = dofile(os.getenv("BENCH_WRK_DIR") .. "/common.lua")
local token = os.getenv("IDEM_TOKEN")
local run = os.getenv("RUN")
local mode = os.getenv("MODE") or "fresh"
local nkeys = tonumber(os.getenv("NKEYS") or "16")
local body = '{"fingerprint": "' .. os.getenv("FP") .. '"}'
local counter = 0

setup = C.setup
done = C.done

-- response() must exist when the script is loaded for wrk to hand it the bodies.
if os.getenv("VERIFY") then C.install_verify(os.getenv("VERIFY")) end

local delay_ms = tonumber(os.getenv("DELAY_MS") or "0")
if delay_ms > 0 then
  function delay() return delay_ms end
end

function request()
  counter = counter + 1
  local key
  if mode == "replay" then
    key = run .. "-rep-" .. ((counter + tid) % nkeys)
  else
    key = run .. "-" .. tid .. "-" .. counter
  end
  return wrk.format("POST", "/v1/claims", {
    ["Authorization"] = "Bearer " .. token,
    ["Idempotency-Key"] = key,
    ["Content-Type"] = "application/json",
  }, body)
end
