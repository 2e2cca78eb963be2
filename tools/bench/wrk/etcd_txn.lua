-- etcd_txn.lua: create-if-absent on etcd's JSON gateway, POST /v3/kv/txn:
-- compare create_revision(key) == 0, then put. Every request a never-used key, so every
-- txn succeeds and is one Raft write (the etcd counterpart of a fresh idemd claim).
-- env: RUN (unique prefix of this run), VERIFY.
local C = dofile(os.getenv("BENCH_WRK_DIR") .. "/common.lua")
local run = os.getenv("RUN")
local value = C.b64("v")
local counter = 0

setup = C.setup
done = C.done

-- response() must exist when the script is loaded for wrk to hand it the bodies.
if os.getenv("VERIFY") then C.install_verify(os.getenv("VERIFY")) end

function request()
  counter = counter + 1
  local k = C.b64(run .. "-" .. tid .. "-" .. counter)
  local body = '{"compare":[{"key":"' .. k .. '","target":"CREATE","result":"EQUAL",'
    .. '"create_revision":"0"}],"success":[{"requestPut":{"key":"' .. k
    .. '","value":"' .. value .. '"}}]}'
  return wrk.format("POST", "/v3/kv/txn", {["Content-Type"] = "application/json"}, body)
end
