-- proxy_order.lua: POST /orders {"amount":100,"currency":"EUR"} with an Idempotency-Key,
-- either straight to the upstream (which ignores the key) or through idemd's proxy listener.
-- env: RUN, MODE=fresh (never-used keys: claim + upstream call + complete)
--      MODE=replay (cycle over NKEYS keys RUN-rep-0.. sent once beforehand: answered from
--                   the stored response, the upstream is not called), VERIFY.
local C = dofile(os.getenv("BENCH_WRK_DIR") .. "/common.lua")
local run = os.getenv("RUN")
local mode = os.getenv("MODE") or "fresh"
local nkeys = tonumber(os.getenv("NKEYS") or "16")
local body = '{"amount":100,"currency":"EUR"}'
local counter = 0

setup = C.setup
done = C.done

-- response() must exist when the script is loaded for wrk to hand it the bodies.
if os.getenv("VERIFY") then C.install_verify(os.getenv("VERIFY")) end

function request()
  counter = counter + 1
  local key
  if mode == "replay" then
    key = run .. "-rep-" .. ((counter + tid) % nkeys)
  else
    key = run .. "-" .. tid .. "-" .. counter
  end
  return wrk.format("POST", "/orders", {
    ["Idempotency-Key"] = key,
    ["Content-Type"] = "application/json",
  }, body)
end
