-- S1: KServe V2 JSON inference request for the example model `simple`
-- (INPUT0 = 0..15, INPUT1 = ones, INT32 [1,16]). The same request is sent to
-- openinfer and to the static nginx limit, so the request bytes match.
wrk.method = "POST"
wrk.headers["Content-Type"] = "application/json"
wrk.body = '{"inputs":['
   .. '{"name":"INPUT0","datatype":"INT32","shape":[1,16],'
   .. '"data":[0,1,2,3,4,5,6,7,8,9,10,11,12,13,14,15]},'
   .. '{"name":"INPUT1","datatype":"INT32","shape":[1,16],'
   .. '"data":[1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1]}]}'

local here = debug.getinfo(1, "S").source:match("^@(.*/)") or "./"
dofile(here .. "report.lua")
