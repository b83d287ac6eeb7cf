-- json_list(list): a Lua array as a JSON array ('[]' when empty: cjson encodes an empty
-- table as an object).
local function json_list(list)
  if #list == 0 then return '[]' end
  return cjson.encode(list)
end
